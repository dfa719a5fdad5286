-- session_claim: a stream resumes a session. The owner and the secret must
-- match, and the session must still live: its serving stream said so
-- within the session TTL. Then the session's epoch moves on, so the stream
-- that served it before can no longer act on its grants (shared/records.lua
-- `stale`).
-- KEYS[1] the session's record
-- ARGV: owner, secret digest
-- Returns {0} gone (closed, or its TTL passed), {-1} refused (wrong secret
-- or owner; nothing changed), or {epoch, ttl_ms, field, token, ...}.
local owner, digest = unpack(ARGV, 1, 2)
local record = redis.call('HGETALL', KEYS[1])
if #record == 0 then
  return {0}
end
local fields, grants = {}, {}
for i = 1, #record, 2 do
  local field, value = record[i], record[i + 1]
  if string.sub(field, 1, 2) == 'g:' then
    table.insert(grants, field)
    table.insert(grants, value)
  else
    fields[field] = value
  end
end
-- 1. Only the owner with the secret learns anything of the session.
if fields.owner ~= owner or fields.digest ~= digest then
  return {-1}
end
-- 2. Silent past its TTL: the session is over (its record outlives that
--    for a while only so that a late stream learns it moved, not to be
--    resumed).
local now, ttl = clock_ms(), tonumber(fields.ttl)
if fields.seen and now > tonumber(fields.seen) + ttl then
  redis.call('DEL', KEYS[1])
  return {0}
end
-- 3. The new stream serves it from now on.
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HSET', KEYS[1], 'seen', int(now))
-- The record outlives its grants' lease twice over (as session_touch).
redis.call('PEXPIRE', KEYS[1], int(ttl * 2))
local reply = {epoch, ttl}
for _, item in ipairs(grants) do
  table.insert(reply, item)
end
return reply

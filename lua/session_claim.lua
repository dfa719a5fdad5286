-- session_claim: a stream resumes a session. The owner and the secret must
-- match; then the session's epoch moves on, so the stream that served it
-- before stops renewing and never releases its grants.
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
if fields.owner ~= owner or fields.digest ~= digest then
  return {-1}
end
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
-- The record outlives its grants' lease twice over (as session_touch).
redis.call('PEXPIRE', KEYS[1], string.format('%d', tonumber(fields.ttl) * 2))
local reply = {epoch, tonumber(fields.ttl)}
for _, item in ipairs(grants) do
  table.insert(reply, item)
end
return reply

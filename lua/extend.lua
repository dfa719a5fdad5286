-- extend: reset the remaining lease of a live grant, only for its holder.
-- KEYS: 1 holders, 2 info, 3 shard index
-- ARGV: 1 holder, 2 fencing token ('' = any), 3 ttl_ms ('' = the grant's
--       own ttl), 4 lock name
-- Returns {1, grant record, expires_at} = extended, {0, '', 0} = not held
local holders_key, info_key, index_key = KEYS[1], KEYS[2], KEYS[3]
local holder, token, name = ARGV[1], ARGV[2], ARGV[4]
local now = redis_now()

-- 1. An expired lease cannot be extended: it is already lost.
local purged = purge_expired(holders_key, info_key, now)

-- 2. Only a live grant of this holder (with this token, if given).
local record = redis.call('HGET', info_key, 'g:' .. holder)
if not record or (token ~= '' and record_token(record) ~= token) then
  if purged > 0 then
    settle(holders_key, info_key, index_key, name)
  end
  return {0, '', 0}
end

-- 3. The new lease runs from now; the record keeps the ttl it was given.
local head, old_ttl, tail = string.match(record, '^(%d+|%d+|%d+|)(%d+)(|.*)$')
local ttl = ARGV[3] ~= '' and ARGV[3] or old_ttl
local expires = now + tonumber(ttl)
record = head .. ttl .. tail
redis.call('ZADD', holders_key, 'XX', expires, holder)
redis.call('HSET', info_key, 'g:' .. holder, record)

-- 4. Key TTLs and the shard index follow the new lease.
settle(holders_key, info_key, index_key, name)
return {1, record, expires}

-- acquire: take one of `limit` permits of a lock for a holder, try once.
-- KEYS: 1 holders, 2 info, 3 shard index, 4 shard fence
-- ARGV: 1 holder, 2 limit, 3 ttl_ms, 4 kind, 5 metadata JSON, 6 lock name
-- Returns {status, grant record, expires_at, holders, next_expiry}
--   status 1 = acquired, 2 = already held (the existing grant), 0 = busy
local holders_key, info_key, index_key, fence_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local holder, limit, ttl, name = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[6]
local now, now_us = redis_now()

-- 1. Expired leases stop counting before anything is decided.
local purged = purge_expired(holders_key, info_key, now)

-- 2. A holder with a live grant gets that same grant back (idempotent retry).
local existing = redis.call('HGET', info_key, 'g:' .. holder)
if existing then
  local expires = tonumber(redis.call('ZSCORE', holders_key, holder))
  return {2, existing, expires, redis.call('ZCARD', holders_key), 0}
end

-- 3. Every permit is taken: no grant; say when the first lease ends.
local held = redis.call('ZCARD', holders_key)
if held >= limit then
  local next_expiry
  if purged > 0 then
    next_expiry = settle(holders_key, info_key, index_key, name)
  else
    next_expiry = tonumber(redis.call('ZRANGE', holders_key, 0, 0, 'WITHSCORES')[2])
  end
  return {0, '', 0, held, next_expiry}
end

-- 4. The smallest free slot: with `held` slots taken, one of 1..held+1 is free.
local slot = 1
while redis.call('HEXISTS', info_key, 's:' .. slot) == 1 do
  slot = slot + 1
end

-- 5. Grant: a fresh fencing token, the lease, the record and the slot.
local token = next_token(fence_key, now_us)
local expires = now + ttl
local record = string.format('%d|%d|%d|%d|%s|%s', token, slot, now, ttl, ARGV[4], ARGV[5])
redis.call('ZADD', holders_key, expires, holder)
redis.call('HSET', info_key, 'g:' .. holder, record, 's:' .. slot, holder, 'limit', limit)

-- 6. Key TTLs and the shard index follow the new lease.
local next_expiry = settle(holders_key, info_key, index_key, name)
return {1, record, expires, held + 1, next_expiry}

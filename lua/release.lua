-- release: give a grant back; only its holder can, optionally pinned to its
-- fencing token.
-- KEYS: 1 holders, 2 info, 3 shard index
-- ARGV: 1 holder, 2 fencing token ('' = any), 3 lock name
-- Returns 1 = released, 0 = not held (nothing changed for this holder)
local holders_key, info_key, index_key = KEYS[1], KEYS[2], KEYS[3]
local holder, token, name = ARGV[1], ARGV[2], ARGV[3]
local now = redis_now()

-- 1. Expired leases are gone first: an expired holder no longer holds.
local purged = purge_expired(holders_key, info_key, now)

-- 2. Only a live grant of this holder (with this token, if given) is released.
local record = redis.call('HGET', info_key, 'g:' .. holder)
if not record or (token ~= '' and record_token(record) ~= token) then
  if purged > 0 then
    settle(holders_key, info_key, index_key, name)
  end
  return 0
end

-- 3. Drop the grant; the last one out deletes the lock's keys.
drop_grant(holders_key, info_key, holder, record)
settle(holders_key, info_key, index_key, name)
return 1

-- extend: reset the remaining lease of a live grant, only for its holder.
-- ARGV: 3 holder, 4 fencing token ('' = any), 5 ttl_ms ('' = the grant's own ttl)
-- Returns {1, grant record, expires_at} = extended, {0, '', 0} = not held
local holder, token = ARGV[3], ARGV[4]
local now = redis_now()
load_lock(holder)

-- 1. An expired lease cannot be extended: it is already lost.
local changed = purge_expired(now) + purge_dead_waiters(now) > 0

-- 2. Only a live grant of this holder (with this token, if given).
local record = L.mine
if not record or (token ~= '' and record_token(record) ~= token) then
  if changed then
    settle()
    wake_eligible()
  end
  return {0, '', 0}
end

-- 3. The new lease runs from now; the record keeps the ttl it was given.
local head, old_ttl, tail = string.match(record, '^(%d+|%d+|%d+|)(%d+)(|.*)$')
local ttl = ARGV[5] ~= '' and ARGV[5] or old_ttl
local expires = now + tonumber(ttl)
record = head .. ttl .. tail
put_grant(holder, expires, record)

-- 4. Key TTLs and the shard index follow the new lease.
settle()
count(record_kind(record), 'extended')
if changed then
  wake_eligible()
end
return {1, record, expires}

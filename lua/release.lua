-- release: give a grant back; only its holder can, optionally pinned to its
-- fencing token. The freed permit goes to the next waiters in line.
-- ARGV: 3 holder, 4 fencing token ('' = any)
-- Returns {1, the released grant record, now} = released,
--         {0, '', now} = not held (nothing changed for this holder)
local holder, token = ARGV[3], ARGV[4]
local now = redis_now()
load_lock(holder)

-- 1. Expired leases and dead waiters go first: an expired holder no longer holds.
local changed = purge_expired(now) + purge_dead_waiters(now) > 0

-- 2. Only a live grant of this holder (with this token, if given) is released.
local record = L.mine
if not record or (token ~= '' and record_token(record) ~= token) then
  if changed then
    settle()
    wake_eligible()
  end
  return {0, '', now}
end

-- 3. Drop the grant; the last one out deletes the lock's keys.
drop_grant(holder, record)
settle()
count(record_kind(record), 'released')
emit('released', holder, record_token(record))

-- 4. Wake whoever may take the permit now.
wake_eligible()
return {1, record, now}

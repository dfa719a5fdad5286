-- release: give a grant back; only its holder can, optionally pinned to its
-- fencing token. The freed permit goes to the next waiter in line.
-- KEYS: the lock's (lock, queue, deadlines, waiters, fence[, live locks])
-- ARGV: holder, token ('' = any), event flags ('0' = none; common.lua `events`)
-- Returns {OK, now, holder, the released grant, events...} or
--         {NOT_HELD, now, '', '', events...} (nothing changed for this holder)
local holder, token, watched = unpack(ARGV, 1, 3)
local now = clock_ms()
local L = load(lock_at(KEYS), holder, watched)

-- 1. Expired leases and dead waiters go first: an expired holder no longer holds.
local changed = purge(L, now)

-- 2. Only a live grant of this holder (with this token, if given) is
--    released. Its record is decoded only for a token to compare, a slot
--    to free, or watchers to tell.
local record = L.mine_text
local grant = record and (token ~= '' or L.limit > 1 or L.watched) and mine(L)
if not record or (token ~= '' and grant.token ~= token) then
  settle_purged(L, changed)
  return {NOT_HELD, now, '', '', unpack(L.events)}
end

-- 3. Drop the grant; the last one out deletes the lock's key.
drop_grant(L, holder, grant and grant.slot)
settle(L)
if grant then
  emit(L, 'released', holder, grant, now, HOLDER, now)
end

-- 4. Wake whoever may take the permit now.
wake_eligible(L)
return {OK, now, holder, record, unpack(L.events)}

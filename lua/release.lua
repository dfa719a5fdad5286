-- release: give a grant back; only its holder can, optionally pinned to its
-- fencing token. The freed permit goes to the next waiter in line.
-- KEYS[1] the lock
-- ARGV: holder, token ('' = any), watched ('1' = publish events)
-- Returns {OK, now, slot, the released grant, events...} or
--         {NOT_HELD, now, 0, '', events...} (nothing changed for this holder)
local holder, token, watched = unpack(ARGV, 1, 3)
local now = clock()
local L = load(lock_at(KEYS), holder, watched)

-- 1. Expired leases and dead waiters go first: an expired holder no longer holds.
local changed = purge(L, now)

-- 2. Only a live grant of this holder (with this token, if given) is released.
local grant, slot = L.mine, L.mine_slot
if not grant or (token ~= '' and grant.token ~= token) then
  settle_purged(L, changed)
  return {NOT_HELD, now, 0, '', unpack(L.events)}
end

-- 3. Drop the grant; the last one out deletes the lock's key.
drop_grant(L, slot, grant)
settle(L)
emit(L, 'released', holder, grant.token, now)

-- 4. Wake whoever may take the permit now.
wake_eligible(L)
return {OK, now, slot, grant.text, unpack(L.events)}

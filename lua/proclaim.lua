-- proclaim: the leader of an election replaces its value. An election is a
-- fair lock of limit 1; its leader is the holder, the term the grant's
-- fencing token, and the value the grant's metadata entry '' (a key that
-- Acquire's metadata may not use, so only elections write it).
-- KEYS: the lock's (lock, queue, deadlines, waiters, fence[, live locks])
-- ARGV: holder, term (the grant's token), value, event flags ('0' = none;
--       common.lua `events`)
-- Returns {OK, now, holder, grant, events...} or {NOT_HELD, now, '', '', events...}
local holder, term, value, watched = unpack(ARGV, 1, 4)
local now = clock_ms()
local L = load(lock_at(KEYS), holder, watched)

-- 1. A lapsed lease goes first: its term is over, whatever it asks.
local changed = purge(L, now)

-- 2. Only the live grant of this holder with exactly this term, on a lock
--    of limit 1 (a semaphore has no leader).
local grant = mine(L)
if not grant or grant.token ~= term or L.limit ~= 1 then
  settle_purged(L, changed)
  return {NOT_HELD, now, '', '', unpack(L.events)}
end

-- 3. The value replaces the entry '' of the grant's metadata; any other
--    entries (a grant made by a plain Acquire) stay.
local metadata = {}
if grant.metadata ~= '' then
  metadata = cjson.decode(grant.metadata)
end
metadata[''] = value
grant.metadata = cjson.encode(metadata)
put_grant(L, grant)

-- 4. Keys as they were (the lease did not move); watchers hear the value.
settle(L)
emit(L, 'proclaimed', holder, grant, now, HOLDER)
if changed then
  wake_eligible(L)
end
return {OK, now, holder, grant.text, unpack(L.events)}

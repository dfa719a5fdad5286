-- proclaim: the leader of an election replaces its value. An election is a
-- fair lock of limit 1; its leader is the holder, the term the grant's
-- fencing token, and the value the grant's metadata entry '' (a key that
-- Acquire's metadata may not use, so only elections write it).
-- KEYS: the lock's (lock, queue, fence[, live locks])
-- ARGV: holder, term (the grant's token), value, event flags ('0' = none;
--       shared/lock.lua `events`), proof (the digest of the leader's secret,
--       decision 0082)
-- Returns {OK, now, holder, grant, events...}, {NOT_HELD, now, '', '', events...}
--   (no leadership of this holder and term) or {NOT_YOURS, now, '', '',
--   events...} (the leadership is there, the proof is not its secret's)
local holder, term, value, watched, proof = unpack(ARGV, 1, 5)
local now = clock_ms()
local L = load(lock_at(KEYS), holder, watched)

-- 1. A lapsed lease goes first: its term is over, whatever it asks.
local changed = purge(L, now)

-- 2. Only the live grant of this holder with exactly this term, made by a
--    Campaign (its metadata has the entry ''), on a plain lock of limit 1
--    (a semaphore, a read/write lock or a plain Acquire's grant has no
--    leader).
local grant = mine(L)
local metadata = {}
if grant and grant.metadata ~= '' then
  metadata = cjson.decode(grant.metadata)
end
if not grant or grant.token ~= term or L.limit ~= 1 or L.mode or metadata[''] == nil then
  settle_purged(L, changed)
  return {NOT_HELD, now, '', '', unpack(L.events)}
end

-- 3. Only the leader itself: the digest of its secret proves it.
if not proof or proof == '' or metadata['\1'] ~= proof then
  settle_purged(L, changed)
  return {NOT_YOURS, now, '', '', unpack(L.events)}
end

-- 4. The value replaces the entry '' of the grant's metadata; the others
--    stay.
metadata[''] = value
grant.metadata = cjson.encode(metadata)
put_grant(L, grant)

-- 5. Keys as they were (the lease did not move); watchers hear the value.
settle(L)
emit(L, 'proclaimed', holder, grant, now, HOLDER)
if changed then
  wake_eligible(L)
end
return {OK, now, holder, grant.text, unpack(L.events)}

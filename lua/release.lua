-- release: give a grant back; only its holder can, optionally pinned to its
-- fencing token. The freed permit goes to the next waiter in line, in
-- this same call (shared/permits.lua `hand_over`).
-- KEYS: the lock's (lock, queue, fence[, live locks])
-- ARGV: holder, then as far as any is not its default: token ('' = any),
--       event flags ('0' = none; shared/lock.lua `events`), epoch (a session's
--       stream; absent or '' = not a session's: shared/records.lua `stale`),
--       handed (a replica giving back a grant handed to its request that
--       is gone: that request's id; released only while the grant is
--       still that request's, shared/permits.lua `hand_over`), proof (the digest
--       of an election's secret: Resign; decision 0082; '' = none), alive
--       (the calling replica's part of its request ids, 'r.', when one of
--       its requests waits here: a grant handed to it is whole, decision 0090)
-- Returns {OK, now, holder, the released grant, events...},
--         {NOT_HELD, now, '', '', events...} (nothing changed for this holder)
--         {MOVED, now, '', '', events...} (a newer stream of the session
--         holds it; nothing changed)
--         or {NOT_YOURS, now, '', '', events...} (an election's grant, and
--         the call proved neither its secret nor its session's stream)
local holder, token, watched, epoch, handed, proof, alive = unpack(ARGV, 1, 7)
token, watched = token or '', watched or '0'
if proof == '' then
  proof = nil
end
if epoch == '' then
  epoch = nil
end
if handed == '' then
  handed = nil
end
local now, now_us = clock()

-- 1. The common case, decided on one read: the holder's grant is the
--    lock's only one, its lease has not ended (no lease ends before the
--    header's earliest expiry), nobody waits, nobody watches and
--    live locks are not counted. Then the lock's key goes, as the steps
--    below would decide, and nobody is to be woken.
local lock_key = KEYS[1]
local read = redis.call('HMGET', lock_key, '_', 'h:' .. holder)
local header, record = read[1], read[2]
if record and watched == '0' and not KEYS[4] and not epoch and not handed then
  local earliest = sole_holder_until(header)
  if earliest and above(earliest, string.sub(now_us, 1, -4))
    and (token == '' or grant_token(record) == token) and not owned(record) then
    redis.call('DEL', lock_key)
    return {OK, now, holder, record}
  end
end
local L = load(lock_at(KEYS), holder, watched, read)
L.alive = alive or false

-- 2. Expired leases and dead waiters go first: an expired holder no longer holds.
local changed = purge(L, now)

-- 3. Only a live grant of this holder (with this token, if given) is
--    released. Its record is decoded only for a token to compare, a slot
--    to free, or watchers to tell.
local record = L.mine_text
local grant = record and (token ~= '' or L.limit > 1 or L.watched or epoch) and mine(L)
if not record or (token ~= '' and grant.token ~= token)
  or (handed and redis.call('HGET', L.key, 'r:' .. holder) ~= handed) then
  settle_purged(L, changed)
  return {NOT_HELD, now, '', '', unpack(L.events)}
end
if stale(grant, epoch) then
  settle_purged(L, changed)
  return {MOVED, now, '', '', unpack(L.events)}
end
-- An election's grant goes only to the one that proves it leads: its
-- secret (Resign), its session's stream (an epoch), or this replica
-- giving back a grant its gone request was handed.
if not epoch and not handed and owned(record) and not proven(record, proof) then
  settle_purged(L, changed)
  return {NOT_YOURS, now, '', '', unpack(L.events)}
end

-- 4. Drop the grant; the permit goes straight to the next waiter in line
--    (shared/permits.lua `hand_over`); the last one out deletes the lock's key.
L.now, L.now_us = now, now_us
give_back(L, grant or true, now)
return {OK, now, holder, record, unpack(L.events)}

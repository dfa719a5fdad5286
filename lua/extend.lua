-- extend: reset the remaining lease of a live grant, only for its holder.
-- KEYS: the lock's (lock, queue, fence[, live locks])
-- ARGV: holder, token ('' = any), ttl_ms ('' = the grant's own ttl),
--       answer_by (Redis ms; '0' = none), event flags ('0' = none; shared/lock.lua
--       `events`), epoch (a session's stream; absent = not a session's)
-- Returns {OK, now, holder, grant, mode, events...} (mode: the lock's
--         header letter, '' for a plain lock: decision 0074),
--         {NOT_HELD, now, '', '', events...},
--         {MOVED, now, '', '', events...} (a newer stream of the session holds
--         it; nothing changed) or {LATE, now, '', ''}
local holder, token, ttl, answer_by, watched, epoch = unpack(ARGV, 1, 6)
local now, now_us = clock()

-- 1. Past the caller's answer-by time nothing happens: it was told no.
if late(answer_by, now_us) then
  return {LATE, now, '', ''}
end
local L = load(lock_at(KEYS), holder, watched)

-- 2. An expired lease cannot be extended: it is already lost.
local changed = purge(L, now)

-- 3. Only a live grant of this holder (with this token, if given).
local grant = mine(L)
if not grant or (token ~= '' and grant.token ~= token) then
  -- The holder learns it lost the grant (watchers hear it as 'lost').
  if L.watched then
    emit(L, 'lost', holder, {token = token ~= '' and token or nil}, now, HOLDER)
  end
  settle_purged(L, changed)
  return {NOT_HELD, now, '', '', unpack(L.events)}
end

-- 4. A superseded stream of a session extends nothing.
if stale(grant, epoch) then
  settle_purged(L, changed)
  return {MOVED, now, '', '', unpack(L.events)}
end

-- 5. The new lease runs from now; the grant keeps the ttl it was given
--    unless a new one is asked for; the key's TTL follows the new lease
--    when it must (shared/held.lua `renew_grant`).
renew_grant(L, grant, ttl, now, changed)
return {OK, now, holder, grant.text, L.mode or '', unpack(L.events)}

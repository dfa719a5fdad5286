-- take_over: one holder's live grant passes to another in one step
-- (Acquire's `takes_over`, decision 0083). The old grant ends; the new
-- holder gets its permits and slots at once, whoever waits (nothing is
-- freed, so nobody is woken or passed), with a fresh fencing token, its
-- own lease, kind and metadata.
-- KEYS: the lock's (lock, queue, fence[, live locks])
-- ARGV: old holder, new holder, ttl_ms, answer_by (Redis ms; '0' = none),
--       limit, kind, metadata (JSON; '' = none), event flags ('0' = none;
--       shared/lock.lua `events`)
-- Returns {OK, now, holders, earliest, 0, holder, grant, events...}
--   or, with nothing changed for either holder: {NOT_HELD, now, ...} (the
--   old holder holds no live grant, or the new one holds one already: the
--   caller then makes an ordinary acquire), LATE, LIMIT_MISMATCH (the
--   lock's limit), MODE_MISMATCH (a read/write lock's grant: 1), NOT_YOURS
--   (an election's grant: it goes only with its secret).
local old, holder, ttl, answer_by, limit_s, kind, metadata, watched = unpack(ARGV, 1, 8)
local now, now_us = clock()

-- 1. Past the caller's answer-by time nothing happens: it was told no.
if late(answer_by, now_us) then
  return {LATE, now, 0, 0, 0}
end

-- 2. One read: the lock's header and both holders' grants. Neither
--    an old holder without a grant nor a new one with a grant is a
--    take-over.
local read = redis.call('HMGET', KEYS[1], '_', 'h:' .. old, 'h:' .. holder)
if not read[2] or read[3] then
  return {NOT_HELD, now, 0, 0, 0}
end
local L = load(lock_at(KEYS), old, watched, read)
L.now, L.now_us = now, now_us

-- 3. Expired leases stop counting first: an old grant that lapsed is not
--    taken over (the acquire that follows decides who gets the permit).
local changed = purge_expired(L, now) > 0
if not L.mine_text then
  settle_purged(L, changed)
  return {NOT_HELD, now, 0, 0, 0, unpack(L.events)}
end

-- 4. What passes must be what the caller asks for: a plain lock's grant
--    of this limit, not an election's nor a session's.
if L.mode then
  settle_purged(L, changed)
  return {MODE_MISMATCH, now, L.holders, 0, 1, unpack(L.events)}
end
if L.limit ~= num(limit_s) then
  settle_purged(L, changed)
  return {LIMIT_MISMATCH, now, L.holders, 0, L.limit, unpack(L.events)}
end
if owned(L.mine_text) or mine(L).epoch ~= '' then
  settle_purged(L, changed)
  return {NOT_YOURS, now, L.holders, 0, 0, unpack(L.events)}
end

-- 5. The old grant goes (its hand-over mark with it) and the new one
--    takes its slots; the permits in use stay as they are.
local before = mine(L)
append(L, 'removed', 'h:' .. old, 'r:' .. old)
L.mine_text, L.mine_grant = false, false
local grant = {
  slot = before.slot, slots = before.slots, permits = before.permits, expires = now + tonumber(ttl),
  token = next_token(L.fence, now_us), acquired_s = string.sub(now_us, 1, -4), ttl = ttl, kind = kind,
  holder = holder, metadata = metadata, epoch = '',
}
if L.holders == before.permits then
  L.earliest, L.earliest_s = grant.expires, false
end
put_grant(L, grant)
if L.limit > 1 then
  for slot in string.gmatch(before.slots, '%d+') do
    change(L, slot, holder)
  end
end
settle(L)
emit(L, 'released', old, before, now, HOLDER, now)
emit(L, 'acquired', holder, grant, now, HOLDER)
if changed then
  wake_eligible(L)
end
return {OK, now, L.holders, L.earliest, 0, holder, grant.text, unpack(L.events)}

-- extend_many: reset the leases of a held set's grants (a multi-lock,
-- decisions 0076 and 0079) in one call, all or nothing: every lock
-- extended when every one is the holder's (with its token), else the set
-- is broken and what is left of it released (nothing of it kept alive).
-- KEYS: per lock its keys, as extend declares them (lock, queue,
--       fence[, live locks]), lock after lock
-- ARGV: holder, ttl_ms ('' = each grant's own ttl), answer_by (Redis ms;
--       '0' = none), flags (events: shared/lock.lua `events`; '0' = none), keys
--       per lock (3 or 4), then one token per lock ('' = any grant of the
--       holder)
-- Returns {status, now, n, then per lock: its status, its grant record
--   ('' when not held), the lock's header letter ('' for a plain lock),
--   then the events noted (event, kind, ...), every lock's}:
--   OK: every lock extended (each its new grant);
--   NOT_HELD: some lock was not the holder's; each lock that was is
--     released (its status OK, its released grant), the others NOT_HELD;
--   LATE: past the caller's answer-by time; nothing changed (n = 0).
local holder, ttl, answer_by, flags, per_s = unpack(ARGV, 1, 5)
local per = num(per_s or '')

-- 0. A malformed call changes nothing.
local n, wrong = set_call(KEYS, ARGV, per, 6)
if n and (holder == '' or not string.match(ttl, '^%d*$') or not string.match(answer_by, '^%d+$')) then
  n, wrong = nil, 'holder, ttl_ms or answer_by malformed'
end
if not n then
  return redis.error_reply('ERR extend_many: ' .. wrong)
end
local now, now_us = clock()

-- 1. Past the caller's answer-by time nothing happens: it was told no.
if late(answer_by, now_us) then
  return {LATE, now, 0}
end

-- 2. Every lock read, its lapsed leases and dead waiters purged (an
--    expired lease cannot be extended: it is already lost).
local locks, changed, grants, all = {}, {}, {}, true
for i = 1, n do
  locks[i], changed[i] = set_lock(KEYS, i, per, holder, flags, now, now_us)
  grants[i] = held_with(locks[i], ARGV[5 + i], true)
  all = all and grants[i] ~= false
end

local out = {all and OK or NOT_HELD, now, n}

-- 3. Every lock the holder's (with its token): each new lease runs from
--    now, with the ttl asked or the grant's own (extend.lua's steps 5-6).
if all then
  for i, L in ipairs(locks) do
    local grant = grants[i]
    renew_grant(L, grant, ttl, now, changed[i])
    out[#out + 1], out[#out + 2], out[#out + 3] = OK, grant.text, L.mode or ''
  end
end

-- 4. Otherwise the set is broken: each grant still the holder's is
--    released (release.lua's step 4); a lock that is not tells its
--    watchers the holder lost it (extend.lua's 'lost').
if not all then
  for i, L in ipairs(locks) do
    local grant = grants[i]
    if grant then
      local record = grant.text
      give_back(L, grant, now)
      out[#out + 1], out[#out + 2], out[#out + 3] = OK, record, ''
    else
      if L.watched then
        local token = ARGV[5 + i]
        emit(L, 'lost', holder, {token = token ~= '' and token or nil}, now, HOLDER)
      end
      settle_purged(L, changed[i])
      out[#out + 1], out[#out + 2], out[#out + 3] = NOT_HELD, '', ''
    end
  end
end

-- 5. Every lock's events after the answer.
return with_events(out, locks)

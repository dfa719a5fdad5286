-- release_many: give back a held set's grants (a multi-lock, decisions
-- 0076 and 0079) in one call: each lock exactly as release.lua's steps
-- 2-4 would, so no other call runs between the set's locks.
-- KEYS: per lock its keys, as release declares them (lock, queue,
--       fence[, live locks]), lock after lock
-- ARGV: holder, flags (events: shared/lock.lua `events`; '0' = none), keys per
--       lock (3 or 4), then one token per lock ('' = any grant of the
--       holder)
-- Returns {status, now, n, then per lock: its status, its released grant
--   ('' when not held), then the events noted (event, kind, ...), every
--   lock's}: status OK when every lock was released, else NOT_HELD (the
--   locks that were the holder's with their token are released all the
--   same: a broken set is of no use to its holder).
local holder, flags, per_s = unpack(ARGV, 1, 3)
local per = num(per_s or '')

-- 0. A malformed call changes nothing.
local n, wrong = set_call(KEYS, ARGV, per, 4)
if not n or holder == '' then
  return redis.error_reply('ERR release_many: ' .. (wrong or 'holder is empty'))
end
local now, now_us = clock()

-- 1. Lock after lock: its lapsed leases and dead waiters purged; only a
--    live grant of the holder with the lock's token (if given) released,
--    its permit handed to the next waiter in line.
local out, locks, all = {OK, now, n}, {}, true
for i = 1, n do
  local L, changed = set_lock(KEYS, i, per, holder, flags, now, now_us)
  local record = L.mine_text
  local grant = held_with(L, ARGV[3 + i])
  -- An election's grant (decision 0082) is released by its Resign or its
  -- session's stream, never as part of a set.
  if grant and owned(record) then
    grant = false
  end
  if grant then
    give_back(L, grant, now)
    out[#out + 1], out[#out + 2] = OK, record
  else
    settle_purged(L, changed)
    out[#out + 1], out[#out + 2] = NOT_HELD, ''
    all = false
  end
  locks[i] = L
end

-- 2. The answer, then every lock's events.
if not all then
  out[1] = NOT_HELD
end
return with_events(out, locks)

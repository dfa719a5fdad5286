-- shared/numbers.lua: the first of the shared steps of tumbler's Redis
-- function library (key layout v3). The files of lua/shared/ are one
-- library part, joined in the order crates/tumbler-engine/build.rs lists
-- (numbers, records, lock, events, permits, held, wait_registry; a file
-- uses only what an earlier file or its own earlier lines define: the
-- engine's `library` test checks it). That part runs once, when the
-- library loads; each operation's file (lua/<operation>.lua) then becomes
-- the body of one function (crates/tumbler-engine/src/scripts.rs) that
-- gets `KEYS` and `ARGV` as locals, names its arguments in one place
-- (`local holder, token = unpack(ARGV, 1, 2)`), and calls the shared steps
-- with a lock table of its own: nothing is repointed from one call to the
-- next.
--
-- This file: reply statuses, the library's constants, numbers as text,
-- the Redis clock and answer-by times, the shard's fencing counter, and a
-- batch's shared TIME (group commit).
--
-- Numbers cross into Redis as decimal text made here (int): a Lua number
-- handed to redis.call is printed with '%.14g', which is slow and, past 14
-- digits, wrong. Text read back is turned into numbers only where a step
-- computes with it (tonumber runs the C library's strtod: one of the
-- dearest steps of a call).

-- Reply statuses, shared by every function (crates/tumbler-engine/src/ops/ has the twins).
local OK = 1            -- acquired, released, extended
local HELD = 2          -- acquire: the holder already holds this grant
local BUSY = 0          -- acquire: every permit taken (or someone goes first)
local QUEUED = 3        -- acquire: waiting in the queue
local QUEUE_FULL = 4    -- acquire: the lock's queue holds its maximum
local NAMESPACE_FULL = 5 -- acquire: no room for another lock of the namespace here
local LIMIT_MISMATCH = 6 -- acquire: the lock is in use with another limit
local LATE = 7          -- a granting call ran past its caller's answer-by time
local NOT_HELD = 8      -- release, extend: no live grant of this holder (and token)
local MOVED = 9         -- a session stream's call: a newer stream of its session owns the grant
local MODE_MISMATCH = 10 -- acquire: a read/write request on a plain lock, or the reverse
local UPGRADE = 11      -- acquire: a reader asked WRITE (refused: nothing changed)
local NOT_YOURS = 12    -- release, proclaim: an election's grant, and the caller did not prove it leads
local ELECTION = 13     -- acquire: a mode or permits on an election's name, or a campaign on a lock of another rule

-- How long a lock's keys outlive its last lease or waiter deadline, so that
-- the reaper (or the next call) sees, counts and cleans up an expiry
-- nobody released; after it, Redis drops the keys by itself. Key TTLs are
-- set with twice this slack so that most extends and renewals need none.
local KEY_GRACE_MS = 60 * 1000
local KEY_TTL_MS = 2 * KEY_GRACE_MS

-- How long an idle shard keeps its fencing counter. Losing it is safe:
-- tokens never fall below the Redis clock in microseconds (next_token).
local FENCE_IDLE_TTL_MS = '604800000'

-- Queue order: higher priority first, then arrival. Priorities span
-- -1000..1000 and arrivals stay below 2^42, so scores stay exact doubles.
local PRIORITY_MAX = 1000
local ARRIVALS = 4398046511104 -- 2^42

-- Fields per HMGET/HDEL/ZREM call when a step works on many, to keep
-- argument lists well inside Lua's stack.
local BATCH = 500

-- Small integers as text and back, made once (by the first call: the
-- string library is not there while the library loads), so counts, slots
-- and limits need no formatting or strtod per call.
local SMALL, SMALL_NUM

local function small_tables()
  SMALL, SMALL_NUM = {}, {}
  for i = 0, 127 do
    local text = string.format('%d', i)
    SMALL[i], SMALL_NUM[text] = text, i
  end
end

-- Integers as exact decimal text (Lua's own tostring keeps 14 digits).
local function int(n)
  if not SMALL then
    small_tables()
  end
  return SMALL[n] or string.format('%d', n)
end

-- Texts of larger numbers that calls repeat (lease and queue TTLs),
-- remembered as numbers once read, up to MEMO_MAX of them.
local MEMO, MEMO_SIZE, MEMO_MAX = {}, 0, 256

-- Decimal text as a number; small and repeated ones without strtod.
local function num(text)
  if not SMALL then
    small_tables()
  end
  local n = SMALL_NUM[text] or MEMO[text]
  if n then
    return n
  end
  n = tonumber(text)
  if MEMO_SIZE < MEMO_MAX then
    MEMO[text], MEMO_SIZE = n, MEMO_SIZE + 1
  end
  return n
end

-- The keys' TTL (text, ms) for a new lock whose lease is `ttl` (text):
-- the lease and twice the grace, remembered per lease TTL like `num`.
local KEYS_TTL, KEYS_TTL_SIZE = {}, 0

local function keys_ttl(ttl)
  local text = KEYS_TTL[ttl]
  if not text then
    text = int(num(ttl) + KEY_TTL_MS)
    if KEYS_TTL_SIZE < MEMO_MAX then
      KEYS_TTL[ttl], KEYS_TTL_SIZE = text, KEYS_TTL_SIZE + 1
    end
  end
  return text
end

-- True when decimal text `a` is the larger number (no strtod: digits of
-- equal length compare as the numbers do).
local function above(a, b)
  return #a > #b or (#a == #b and a > b)
end

-- Zeros that pad TIME's microseconds to six digits.
local PAD = {'00000', '0000', '000', '00', '0', ''}

-- The second TIME gave last, as text and in milliseconds: it changes once
-- a second, so its strtod runs once a second rather than once a call (a
-- cache, not state: it holds what that text means).
local SECOND, SECOND_MS = false, 0

-- Group commit (lua/batch.lua runs many operations in one call): while a
-- batch runs, BATCH_TIME holds the one TIME reply all its operations read
-- (`clock`), BATCH_LATE the milliseconds below which an answer-by time is
-- checked against the clock anew (`late`), and FENCES the last token
-- handed out per fence key, with FENCES_DUE the ones still to be written
-- (`next_token`; written once, the highest, by `batch_end`). Library
-- globals outlive a call, so `batch_end` clears them and every call that
-- is not a batch finds them false.
local BATCH_TIME, BATCH_LATE, FENCES, FENCES_DUE = false, false, false, false

-- How far ahead of the batch's TIME an answer-by time must lie to be
-- judged on that TIME: a batch runs for well under this, so nearer ones
-- are judged on a fresh TIME (no grant past its caller's answer-by).
local BATCH_LATE_MS = 50

-- The Redis clock: milliseconds since the epoch (a number), and the same
-- instant as text in microseconds (TIME's own digits, no formatting).
-- In a batch, the batch's one TIME.
local function clock()
  local t = BATCH_TIME or redis.call('TIME')
  local seconds, micros = t[1], PAD[#t[2]] .. t[2]
  if seconds ~= SECOND then
    SECOND, SECOND_MS = seconds, tonumber(seconds) * 1000
  end
  local a, b, c = string.byte(micros, 1, 3)
  return SECOND_MS + a * 100 + b * 10 + c - 5328, seconds .. micros
end

-- The Redis clock in milliseconds only.
local function clock_ms()
  return (clock())
end

-- True when a granting call runs after its caller's answer-by time
-- (Redis clock, ms; absent or '0': no bound): the replica has answered
-- the caller already (deadline, timeout), so nothing may be granted.
-- `now_us` is the clock as text in microseconds (`clock`'s second value),
-- compared as text: no strtod.
local function late(answer_by, now_us)
  if not answer_by or answer_by == '0' then
    return false
  end
  if above(string.sub(now_us, 1, -4), answer_by) then
    return true
  end
  -- In a batch `now_us` is the batch's TIME, which later operations of it
  -- run after: an answer-by within BATCH_LATE_MS of it meets the clock now.
  if BATCH_TIME and not above(answer_by, BATCH_LATE) then
    local t = redis.call('TIME')
    return above(t[1] .. string.sub(PAD[#t[2]] .. t[2], 1, 3), answer_by)
  end
  return false
end

-- The next fencing token of the shard: one more than the last one, and
-- never below the Redis clock in microseconds. A lost counter (restart
-- without persistence, failover to a lagging replica) therefore resumes
-- above every token it handed out, as long as the clock moves forward.
-- Usually one call: the clock is ahead of the last token (both are
-- 16-digit text then, which compares as the numbers do).
-- In a batch, the shard's counter is read and set once (the first grant's
-- SET … GET); the batch's later grants count on from the last token it
-- handed out, and `batch_end` writes the highest once.
local function next_token(fence, now_us)
  local given = FENCES and FENCES[fence]
  if given then
    local token = int(tonumber(given) + 1)
    FENCES[fence], FENCES_DUE[fence] = token, true
    return token
  end
  local last = redis.call('SET', fence, now_us, 'GET', 'PX', FENCE_IDLE_TTL_MS)
  local token = now_us
  if last and not ((#last == #now_us and last < now_us) or #last < #now_us) then
    token = int(tonumber(last) + 1)
    if FENCES then
      FENCES_DUE[fence] = true
    else
      redis.call('SET', fence, token, 'PX', FENCE_IDLE_TTL_MS)
    end
  end
  if FENCES then
    FENCES[fence] = token
  end
  return token
end

-- A batch's start: its one TIME (and the answer-by bound it judges on).
local function batch_begin()
  BATCH_TIME = redis.call('TIME')
  BATCH_LATE = BATCH_TIME[1] .. string.sub(PAD[#BATCH_TIME[2]] .. BATCH_TIME[2], 1, 3)
  BATCH_LATE = int(tonumber(BATCH_LATE) + BATCH_LATE_MS)
  FENCES, FENCES_DUE = {}, {}
end

-- A batch's end: each shard counter a later grant moved is written once,
-- with the highest token, and the batch's state is cleared.
local function batch_end()
  for fence in pairs(FENCES_DUE) do
    redis.call('SET', fence, FENCES[fence], 'PX', FENCE_IDLE_TTL_MS)
  end
  BATCH_TIME, BATCH_LATE, FENCES, FENCES_DUE = false, false, false, false
end

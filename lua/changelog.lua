-- flags: no-writes (reads only: Redis runs it even while it refuses writes)
-- changelog: where one shard's part of a changelog page starts. Reads
-- only, and bounded whatever the list holds: a search of the list by time
-- (LINDEX probes: about 2*log2 of the start's position, at most ~22 for a
-- full list of 1,125 entries). The entries themselves are read by the
-- replica with one LRANGE counted from the list's tail, which pushes at
-- the head do not move: no entry passes through Lua but the probes (an
-- entry read into Lua costs Redis several times what LRANGE does).
-- Within a shard the list is in time order (emit pushes each event at the
-- head with its call's Redis time), so where to start is a position in
-- time: the newest entry at or before `at`, past the events of the
-- millisecond `at` itself that the reader has had already.
-- KEYS[1] the shard's changelog list ('...:c', newest first)
-- ARGV: at (Redis ms; '' = the newest: everything before this call's own
--   millisecond), skip ('all' = none of `at` itself, n = all of `at` but
--   its n newest, which the reader has had)
-- Returns {now, length, start, head}: the list's length, the index (from
-- the head) of the page's first entry (= length: nothing is left), and
-- that entry's first lines up to its time ('' if none), by which the
-- reader checks that its LRANGE found the same entry.
local at, skip = unpack(ARGV, 1, 2)
local now = clock_ms()
local log = KEYS[1]

-- An entry's first lines up to its time (namespace, name, event, holder,
-- token, time) and its time (0 if unreadable).
local HEAD = '^([^\n]*\n[^\n]*\n[^\n]*\n[^\n]*\n[^\n]*\n(%d+))'
local function entry_at(i)
  local message = redis.call('LINDEX', log, int(i))
  if not message then
    return nil
  end
  local head, time = string.match(message, HEAD)
  return tonumber(time) or 0, head or ''
end

-- The index of the newest entry at or before `t` (the list's length if
-- none): doubling steps from the head, then halving.
local function first_at_or_before(t)
  local lo, hi = 0, 0
  while true do
    local seen = entry_at(hi)
    if not seen or seen <= t then
      break
    end
    lo, hi = hi + 1, hi * 2 + 1
  end
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local seen = entry_at(mid)
    if not seen or seen <= t then
      hi = mid
    else
      lo = mid + 1
    end
  end
  return lo
end

local upto = at == '' and now - 1 or tonumber(at)
local start
if skip == 'all' then
  start = first_at_or_before(upto - 1)
else
  local n = tonumber(skip)
  start = first_at_or_before(upto) + n
  -- Fewer events of that millisecond than skipped are left (the rest
  -- were trimmed): the page starts after the millisecond.
  if n > 0 and entry_at(start - 1) ~= upto then
    start = first_at_or_before(upto - 1)
  end
end
local length = redis.call('LLEN', log)
local _, head = entry_at(start)
return {now, length, start, head or ''}

-- common.lua: the prelude every tumbler script starts with (tumbler joins it
-- in front of each operation script before loading). It holds the steps
-- that several operations share, so each operation reads top to bottom.
--
-- A script on one lock gets seven keys, all with the shard's hash tag, so
-- one script touches one cluster slot:
--   KEYS[1] holders   ZSET holder id -> lease expiry (ms, Redis clock)
--   KEYS[2] info      HASH 'g:<holder>' -> grant record, 's:<slot>' -> holder,
--                          'w:<id>' -> waiter record, 'limit' -> limit of
--                          the latest grant, 'seq' -> arrival counter
--   KEYS[3] queue     ZSET waiting request id -> order (priority, arrival)
--   KEYS[4] deadlines ZSET waiting request id -> liveness deadline (ms)
--   KEYS[5] index     ZSET (per shard) lock name -> next time something in it expires
--   KEYS[6] names     ZSET (per shard) lock name -> 0, in name order (listing)
--   KEYS[7] fence     STRING (per shard) last fencing token
--   ARGV[1] the lock's name, ARGV[2] the wake-up channel
-- Each shard also has per-minute counters, '<shard>:m:<minute ms>' HASH
-- 'kind|event' -> count, kept for METRICS_RETENTION_MS.
-- A script that walks a shard (list, reap, clear) gets only KEYS[1] index,
-- KEYS[2] names, KEYS[3] fence, and points the shared steps at each lock
-- it visits with use_lock (the lock keys it derives carry the same tag).
-- A grant record is 'token|slot|acquired_at_ms|ttl_ms|kind|metadata_json';
-- a waiter record is 'priority|enqueued_at_ms|wait_deadline_ms|fair|kind'.

local HOLDERS, INFO, QUEUE, DEADLINES, INDEX, NAMES, FENCE
if #KEYS == 3 then
  INDEX, NAMES, FENCE = KEYS[1], KEYS[2], KEYS[3]
else
  HOLDERS, INFO, QUEUE, DEADLINES, INDEX, NAMES, FENCE = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
end
local LOCK_NAME, WAKE_CHANNEL = ARGV[1], ARGV[2]

-- Point the shared steps at one lock of the shard whose keys start with
-- `shard` ('<prefix>:{<namespace>:<shard>}').
local function use_lock(shard, name)
  HOLDERS, INFO = shard .. ':h:' .. name, shard .. ':i:' .. name
  QUEUE, DEADLINES = shard .. ':q:' .. name, shard .. ':d:' .. name
  LOCK_NAME = name
end

-- The shard's key prefix '<prefix>:{<namespace>:<shard>}' (its index key
-- without ':index'), for keys that belong to the whole shard.
local SHARD = string.sub(INDEX, 1, -7)

-- How long per-minute counters are kept, and how many distinct
-- 'kind|event' fields one shard-minute may hold before further kinds are
-- counted as 'other' (kinds are metrics labels: their number stays bounded).
local METRICS_RETENTION_MS = 24 * 3600 * 1000
local METRICS_MAX_FIELDS = 512

-- How long a lock's keys outlive its last lease or waiter deadline, so
-- that the reaper (or the next script) sees, counts and cleans up an
-- expiry nobody released; after it, Redis drops the keys by itself.
local KEY_GRACE_MS = 60 * 1000

-- How long an idle shard keeps its fencing counter. Losing it is safe:
-- tokens never fall below the Redis clock in microseconds (next_token).
local FENCE_IDLE_TTL_MS = 7 * 24 * 3600 * 1000

-- Queue order: higher priority first, then arrival. Priorities span
-- -1000..1000 and arrivals stay below 2^42, so scores stay exact doubles.
local PRIORITY_MAX = 1000
local ARRIVALS = 4398046511104 -- 2^42

-- Integers as exact decimal text (Lua's own tostring keeps 14 digits).
local function int(n)
  return string.format('%d', n)
end

-- The Redis clock, in milliseconds and in microseconds since the epoch.
-- The script's first call also fixes NOW_MS for the counters below.
local NOW_MS = 0
local function redis_now()
  local t = redis.call('TIME')
  local secs, micros = tonumber(t[1]), tonumber(t[2])
  NOW_MS = secs * 1000 + math.floor(micros / 1000)
  return NOW_MS, secs * 1000000 + micros
end

-- Lock events for watchers go to '<prefix>:events' (beside the wake-up
-- channel) as 'namespace\nname\nevent\nholder\ntoken\ntime_ms'. With no
-- replica subscribed (nobody watches), a PUBLISH costs Redis next to nothing.
local EVENTS_CHANNEL = string.gsub(WAKE_CHANNEL or '', 'wake$', 'events')
local function emit(event, holder, token)
  local namespace = string.match(SHARD, '{(.*):%d+}$') or ''
  redis.call('PUBLISH', EVENTS_CHANNEL,
    table.concat({namespace, LOCK_NAME, event, holder, token or '0', int(NOW_MS)}, '\n'))
end

-- Count `n` events of a kind in this shard's counters for the current
-- minute, where every replica's counts meet (the Metrics RPC sums them).
local function count(kind, event, n)
  if n == 0 then
    return
  end
  n = n or 1
  local key = SHARD .. ':m:' .. int(NOW_MS - NOW_MS % 60000)
  local field = kind .. '|' .. event
  -- Most counts add to a field the minute already has: one call. Only a
  -- new field (and so a new key) needs the cap check and the expiry.
  if redis.call('HINCRBY', key, field, n) ~= n then
    return
  end
  if redis.call('HLEN', key) > METRICS_MAX_FIELDS then
    redis.call('HDEL', key, field)
    redis.call('HINCRBY', key, 'other|' .. event, n)
  end
  redis.call('PEXPIRE', key, METRICS_RETENTION_MS)
end

-- The kind inside a grant record.
local function record_kind(record)
  return string.match(record, '^%d+|%d+|%d+|%d+|([^|]*)|') or 'default'
end

-- The fencing token inside a grant record, as the decimal text it was
-- written as (compared as text: no float rounding).
local function record_token(record)
  return string.match(record, '^(%d+)|')
end

-- The slot number inside a grant record.
local function record_slot(record)
  return string.match(record, '^%d+|(%d+)|')
end

-- Remove one holder's grant: its record, its slot and its lease.
local function drop_grant(holder, record)
  redis.call('HDEL', INFO, 'g:' .. holder, 's:' .. record_slot(record))
  redis.call('ZREM', HOLDERS, holder)
end

-- Holders whose lease has passed stop counting now: drop their grants
-- (each counted as 'expired'). Returns how many were dropped.
local function purge_expired(now)
  local expired = redis.call('ZRANGEBYSCORE', HOLDERS, '-inf', now)
  for _, holder in ipairs(expired) do
    local record = redis.call('HGET', INFO, 'g:' .. holder)
    if record then
      drop_grant(holder, record)
      count(record_kind(record), 'expired')
      emit('expired', holder, record_token(record))
    else
      redis.call('ZREM', HOLDERS, holder)
    end
  end
  return #expired
end

-- Remove one waiting request from the queue.
local function drop_waiter(id)
  redis.call('ZREM', QUEUE, id)
  redis.call('ZREM', DEADLINES, id)
  redis.call('HDEL', INFO, 'w:' .. id)
end

-- Waiting requests whose replica stopped refreshing them (crashed, cut
-- off) are dead: they leave the queue instead of holding it up (each
-- counted as 'reaped'). Returns how many were removed.
local function purge_dead_waiters(now)
  local dead = redis.call('ZRANGEBYSCORE', DEADLINES, '-inf', now)
  for _, id in ipairs(dead) do
    local record = redis.call('HGET', INFO, 'w:' .. id) or ''
    count(string.match(record, '|([^|]*)$') or 'default', 'reaped')
    emit('dequeued', id)
    drop_waiter(id)
  end
  return #dead
end

-- Tell the head of the queue that it may now be granted, in one message
-- '<queue key>\n<id>' that every replica receives and hands to its own
-- waiter. The head, once granted, wakes the next one while permits remain.
local function wake_eligible()
  -- An empty queue (the common case) needs no more than this one call.
  local head = redis.call('ZRANGE', QUEUE, 0, 0)
  if #head == 0 then
    return
  end
  local held = redis.call('ZCARD', HOLDERS)
  local free = tonumber(redis.call('HGET', INFO, 'limit') or '1') - held
  if free > 0 then
    redis.call('PUBLISH', WAKE_CHANNEL, QUEUE .. '\n' .. head[1])
  end
end

-- Make a key that outlives nothing it indexes: a fresh key has no TTL yet
-- (GT would refuse it), an existing one only ever grows its TTL.
local function expire_no_sooner(key, at)
  -- GT sets a later expiry in one call (the usual case: the newest lock
  -- lives longest); it leaves a key without TTL alone, which gets one here.
  if redis.call('PEXPIREAT', key, int(at), 'GT') == 0 and redis.call('PTTL', key) == -1 then
    redis.call('PEXPIREAT', key, int(at))
  end
end

-- After any change: a lock nobody holds or waits for leaves no key behind
-- (nor an entry in the shard's indexes); otherwise its keys expire a grace
-- period after the last lease or waiter deadline (so Redis cleans up even
-- if nothing touches the lock again), the expiry index records the next time something in it
-- expires, and the name index lists it. Both indexes live as long as their
-- longest-lived lock.
-- Returns the earliest lease expiry, or 0 when nobody holds the lock.
local function settle()
  local last_lease = redis.call('ZRANGE', HOLDERS, -1, -1, 'WITHSCORES')
  local last_waiter = redis.call('ZRANGE', DEADLINES, -1, -1, 'WITHSCORES')
  if #last_lease == 0 and #last_waiter == 0 then
    redis.call('DEL', HOLDERS, INFO, QUEUE, DEADLINES)
    redis.call('ZREM', INDEX, LOCK_NAME)
    redis.call('ZREM', NAMES, LOCK_NAME)
    return 0
  end
  local last_deadline = math.max(tonumber(last_lease[2] or 0), tonumber(last_waiter[2] or 0))
  local keep_until = last_deadline + KEY_GRACE_MS
  -- The queue and its deadlines exist only while someone waits (both go
  -- together): with nobody waiting they need neither a look nor a TTL.
  local keys, first_lease, first_waiter = {HOLDERS, INFO}, last_lease, last_waiter
  if #last_waiter > 0 then
    keys = {HOLDERS, INFO, QUEUE, DEADLINES}
    first_waiter = redis.call('ZRANGE', DEADLINES, 0, 0, 'WITHSCORES')
  end
  if #last_lease > 0 then
    first_lease = redis.call('ZRANGE', HOLDERS, 0, 0, 'WITHSCORES')
  end
  for _, key in ipairs(keys) do
    redis.call('PEXPIREAT', key, int(keep_until))
  end
  local next_event = math.min(tonumber(first_lease[2] or last_deadline), tonumber(first_waiter[2] or last_deadline))
  redis.call('ZADD', INDEX, int(next_event), LOCK_NAME)
  redis.call('ZADD', NAMES, 0, LOCK_NAME)
  expire_no_sooner(INDEX, keep_until)
  expire_no_sooner(NAMES, keep_until)
  return tonumber(first_lease[2] or 0)
end

-- The next fencing token of the shard: one more than the last one, and
-- never below the Redis clock in microseconds. A lost counter (restart
-- without persistence, failover to a lagging replica) therefore resumes
-- above every token it handed out, as long as the clock moves forward.
local function next_token(now_us)
  local token = math.max(tonumber(redis.call('GET', FENCE) or '0'), now_us) + 1
  redis.call('SET', FENCE, int(token), 'PX', FENCE_IDLE_TTL_MS)
  return token
end

-- The script of the operation follows.

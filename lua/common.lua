-- common.lua: the shared part of tumbler's Redis function library. It runs
-- once, when the library loads; each operation's file then becomes the
-- body of one function (src/engine/scripts.rs), which first calls `enter`
-- (at the end of this file) to point these steps at its keys and
-- arguments. It holds the steps that several operations share, so each
-- operation reads top to bottom.
--
-- Key layout v2. A script on one lock gets six keys, all with the shard's
-- hash tag, so one script touches one cluster slot:
--   KEYS[1] lock      HASH, the whole lock in one key:
--                       'g:<holder>' -> grant (below), 's:<slot>' -> holder,
--                       'n' -> holders, 'e' -> no lease ends before this (ms),
--                       'top' -> highest slot handed out since the key appeared,
--                       'limit' -> limit of the latest grant,
--                       'w:<id>' -> waiter record, 'seq' -> arrival counter,
--                       present exactly while someone may wait (so a lock
--                       without it needs no look at its queue)
--   KEYS[2] queue     ZSET waiting request id -> order (priority, arrival);
--                       exists only while someone waits
--   KEYS[3] deadlines ZSET waiting request id -> liveness deadline (ms); with the queue
--   KEYS[4] index     ZSET (per shard) lock name -> next time something in it expires
--   KEYS[5] names     ZSET (per shard) lock name -> 0, in name order (listing)
--   KEYS[6] fence     STRING (per shard) last fencing token
--   ARGV[1] the lock's name, ARGV[2] the wake-up channel
-- Each shard also has per-minute counters, '<shard>:m:<minute ms>' HASH
-- 'kind|event' -> count, kept for METRICS_RETENTION_MS.
-- A script that walks a shard (list, reap, clear, renew) gets only KEYS[1]
-- index, KEYS[2] names, KEYS[3] fence, and points the shared steps at each
-- lock it visits with use_lock (the lock keys it derives carry the same tag).
--
-- A grant is stored as 'expires_at_ms|token|slot|acquired_at_ms|ttl_ms|kind|metadata_json';
-- scripts answer with its record, the same without 'expires_at_ms|'.
-- A waiter record is 'priority|enqueued_at_ms|wait_deadline_ms|fair|kind'.
--
-- Numbers cross into Redis as decimal text made here (int, or literals in
-- quotes): a Lua number handed to redis.call is printed with '%.14g', which
-- is both slow and, past 14 digits, wrong.

-- The call's keys and arguments, and the keys of the lock it works on
-- (all set by `enter`).
local KEYS, ARGV
local LOCK, QUEUE, DEADLINES, INDEX, NAMES, FENCE
local LOCK_NAME, WAKE_CHANNEL

-- The shard's key prefix '<prefix>:{<namespace>:<shard>}' (its index key
-- without ':index'), for keys that belong to the whole shard.
local SHARD

-- How long per-minute counters are kept, and how many distinct
-- 'kind|event' fields one shard-minute may hold before further kinds are
-- counted as 'other' (kinds are metrics labels: their number stays bounded).
local METRICS_RETENTION_MS = '86400000'
local METRICS_MAX_FIELDS = 512

-- How long a lock's keys outlive its last lease or waiter deadline, so
-- that the reaper (or the next script) sees, counts and cleans up an
-- expiry nobody released; after it, Redis drops the keys by itself.
local KEY_GRACE_MS = 60 * 1000

-- How long an idle shard keeps its fencing counter. Losing it is safe:
-- tokens never fall below the Redis clock in microseconds (next_token).
local FENCE_IDLE_TTL_MS = '604800000'

-- Queue order: higher priority first, then arrival. Priorities span
-- -1000..1000 and arrivals stay below 2^42, so scores stay exact doubles.
local PRIORITY_MAX = 1000
local ARRIVALS = 4398046511104 -- 2^42

-- Fields per HMGET/HDEL call when a step walks every slot of a lock, to
-- keep argument lists well inside Lua's stack.
local BATCH = 500

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
local EVENTS_CHANNEL
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
  if redis.call('HINCRBY', key, field, int(n)) ~= n then
    return
  end
  if redis.call('HLEN', key) > METRICS_MAX_FIELDS then
    redis.call('HDEL', key, field)
    redis.call('HINCRBY', key, 'other|' .. event, int(n))
  end
  redis.call('PEXPIRE', key, METRICS_RETENTION_MS)
end

-- A stored grant as (lease expiry, public record). The record's fields:
-- token, slot, acquired_at, ttl, kind, metadata.
local function split_grant(stored)
  local expires, record = string.match(stored, '^(%d+)|(.*)$')
  return tonumber(expires), record
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

-- The kind inside a waiter record.
local function waiter_kind(record)
  return string.match(record or '', '|([^|]*)$') or 'default'
end

-- Point the shared steps at one lock of the shard whose keys start with
-- `shard` ('<prefix>:{<namespace>:<shard>}').
local function use_lock(shard, name)
  LOCK, QUEUE, DEADLINES = shard .. ':l:' .. name, shard .. ':q:' .. name, shard .. ':d:' .. name
  LOCK_NAME = name
end

-- The lock as this script sees it, read once by load_lock and kept up to
-- date by the steps below; settle writes what changed.
--   n, e, top, limit: the hash's fields (0 when absent; limit 1)
--   exists:   the lock's hash existed when the script began
--   listed:   the caller found the lock in a shard index (settle then
--             removes index entries even when the hash is gone)
--   mine, mine_expires: the grant record and lease expiry of the holder
--             load_lock was asked about (nil when it holds nothing)
--   changes:  fields to write back in settle ('n', 'e', ... and grants)
--   removed:  fields to delete in settle (unless the whole key goes)
--   keep_until: the keys must live at least until then (0: no new need)
--   queue_known, head: the first waiting request, once looked up
--   may_wait: 'seq' is set, so the queue may hold someone
--   queue_fresh: this script made the queue keys (they have no TTL yet)
local L

local function load_lock(holder, listed)
  local v = redis.call('HMGET', LOCK, 'n', 'e', 'top', 'limit', 'seq', 'g:' .. (holder or ''))
  L = {
    n = tonumber(v[1] or '0'), e = tonumber(v[2] or '0'), top = tonumber(v[3] or '0'),
    limit = tonumber(v[4] or '1'), exists = (v[1] or v[5]) and true or false,
    listed = listed or false, holder = holder, changes = {}, removed = {}, keep_until = 0,
    queue_known = false, head = nil, queue_fresh = false, may_wait = v[5] and true or false,
  }
  if v[6] then
    L.mine_expires, L.mine = split_grant(v[6])
  end
end

-- Queue a field for settle's one HSET.
local function change(field, value)
  table.insert(L.changes, field)
  table.insert(L.changes, value)
end

-- The id of the first waiting request, or nil when nobody waits (one call
-- the first time, none at all without 'seq', then remembered until the
-- queue changes).
local function queue_head()
  if not L.queue_known then
    L.head = L.may_wait and redis.call('ZRANGE', QUEUE, '0', '0')[1] or nil
    L.queue_known = true
  end
  return L.head
end

local function queue_changed()
  L.queue_known = false
end

-- The keys must outlive a new lease or waiter deadline by the grace.
local function keep_keys_until(at)
  L.keep_until = math.max(L.keep_until, at + KEY_GRACE_MS)
end

-- A command on many fields of the lock's hash (HMGET, HDEL), in batches;
-- returns the replies' elements in field order (HMGET's values).
local function on_fields(command, fields)
  local values = {}
  for first = 1, #fields, BATCH do
    local part = redis.call(command, LOCK, unpack(fields, first, math.min(first + BATCH - 1, #fields)))
    if type(part) == 'table' then
      for _, value in ipairs(part) do
        table.insert(values, value)
      end
    end
  end
  return values
end

-- HMGET of many fields.
local function hmget_all(fields)
  return on_fields('HMGET', fields)
end

-- Delete the fields dropped so far (before anything reads them again).
local function flush_removed()
  on_fields('HDEL', L.removed)
  L.removed = {}
end

-- Every holder of the lock, expired or not: {{holder, expires, record}, ...}
-- in slot order. Walks slots 1..top: two calls whatever the count.
local function all_grants()
  flush_removed()
  if L.n == 0 or L.top == 0 then
    return {}
  end
  local slots = {}
  for slot = 1, L.top do
    slots[slot] = 's:' .. int(slot)
  end
  local holders, fields = {}, {}
  for _, holder in ipairs(hmget_all(slots)) do
    if holder then
      table.insert(holders, holder)
      table.insert(fields, 'g:' .. holder)
    end
  end
  local grants = {}
  for i, stored in ipairs(hmget_all(fields)) do
    if stored then
      local expires, record = split_grant(stored)
      table.insert(grants, {holders[i], expires, record})
    end
  end
  return grants
end

-- Remove one holder's grant: its record and its slot (deleted in settle,
-- which deletes the whole key instead when nothing is left).
local function drop_grant(holder, record)
  table.insert(L.removed, 'g:' .. holder)
  table.insert(L.removed, 's:' .. record_slot(record))
  L.n = L.n - 1
  if L.n == 0 then
    L.e = 0
  end
  change('n', int(L.n))
  if holder == L.holder then
    L.mine, L.mine_expires = nil, nil
  end
end

-- Store a holder's grant with its lease expiry (L.n already counts it):
-- 'e' stays a bound no lease ends before (exact for a sole holder), and
-- the keys outlive the lease.
local function put_grant(holder, expires, record)
  change('g:' .. holder, int(expires) .. '|' .. record)
  L.e = L.n == 1 and expires or math.min(L.e, expires)
  change('e', int(L.e))
  keep_keys_until(expires)
end

-- Holders whose lease has passed stop counting now: drop their grants
-- (each counted as 'expired'). Nothing to do while the earliest possible
-- expiry 'e' lies ahead; otherwise every grant is looked at once and 'e'
-- becomes exact again. Returns how many were dropped.
local function purge_expired(now)
  if L.n == 0 or L.e > now then
    return 0
  end
  local dropped, earliest = 0, nil
  for _, grant in ipairs(all_grants()) do
    local holder, expires, record = grant[1], grant[2], grant[3]
    if expires <= now then
      drop_grant(holder, record)
      count(record_kind(record), 'expired')
      emit('expired', holder, record_token(record))
      dropped = dropped + 1
    elseif not earliest or expires < earliest then
      earliest = expires
    end
  end
  L.e = earliest or 0
  change('e', int(L.e))
  return dropped
end

-- Remove one waiting request from the queue.
local function drop_waiter(id)
  redis.call('ZREM', QUEUE, id)
  redis.call('ZREM', DEADLINES, id)
  redis.call('HDEL', LOCK, 'w:' .. id)
  queue_changed()
end

-- Waiting requests whose replica stopped refreshing them (crashed, cut
-- off) are dead: they leave the queue instead of holding it up (each
-- counted as 'reaped'). Returns how many were removed.
local function purge_dead_waiters(now)
  if not queue_head() then
    return 0
  end
  local dead = redis.call('ZRANGEBYSCORE', DEADLINES, '-inf', int(now))
  for _, id in ipairs(dead) do
    count(waiter_kind(redis.call('HGET', LOCK, 'w:' .. id)), 'reaped')
    emit('dequeued', id)
    drop_waiter(id)
  end
  return #dead
end

-- Tell the head of the queue that it may now be granted, in one message
-- '<queue key>\n<id>' that every replica receives and hands to its own
-- waiter. The head, once granted, wakes the next one while permits remain.
local function wake_eligible()
  local head = queue_head()
  if head and L.limit - L.n > 0 then
    redis.call('PUBLISH', WAKE_CHANNEL, QUEUE .. '\n' .. head)
  end
end

-- Make a key that outlives nothing it indexes: a fresh key has no TTL yet
-- (GT would refuse it), an existing one only ever grows its TTL.
local function expire_no_sooner(key, at)
  -- GT sets a later expiry in one call (the usual case: the newest lock
  -- lives longest); it leaves a key without TTL alone, which NX then sets.
  if redis.call('PEXPIREAT', key, at, 'GT') == 0 then
    redis.call('PEXPIREAT', key, at, 'NX')
  end
end

-- After any change: a lock nobody holds or waits for leaves no key behind
-- (nor an entry in the shard's indexes). Otherwise the changed fields are
-- written in one call, the keys outlive every lease and waiter deadline by
-- the grace (TTLs only ever grow), the expiry index records the next time
-- something in the lock may expire, and the name index lists it. Both
-- indexes live as long as their longest-lived lock.
-- Returns the earliest possible lease expiry, or 0 when nobody holds it.
local function settle()
  local head = queue_head()
  if L.n == 0 and not head then
    if L.exists or L.listed or #L.changes > 0 then
      redis.call('DEL', LOCK, QUEUE, DEADLINES)
      redis.call('ZREM', INDEX, LOCK_NAME)
      redis.call('ZREM', NAMES, LOCK_NAME)
    end
    L.changes, L.removed = {}, {}
    return 0
  end
  -- An empty queue drops its arrival counter: 'seq' says someone may wait.
  if not head and L.may_wait then
    table.insert(L.removed, 'seq')
    L.may_wait = false
  end
  flush_removed()
  if #L.changes > 0 then
    redis.call('HSET', LOCK, unpack(L.changes))
    L.changes = {}
  end
  local next_event = L.n > 0 and L.e or nil
  if head then
    local first_waiter = tonumber(redis.call('ZRANGE', DEADLINES, '0', '0', 'WITHSCORES')[2])
    next_event = math.min(next_event or first_waiter, first_waiter)
  end
  redis.call('ZADD', INDEX, int(next_event), LOCK_NAME)
  if not L.exists then
    redis.call('ZADD', NAMES, '0', LOCK_NAME)
  end
  if L.keep_until > 0 then
    local at = int(L.keep_until)
    -- A key made by this very script has no TTL yet: GT would leave it so.
    redis.call('PEXPIREAT', LOCK, at, L.exists and 'GT' or 'NX')
    if head then
      local option = L.queue_fresh and 'NX' or 'GT'
      redis.call('PEXPIREAT', QUEUE, at, option)
      redis.call('PEXPIREAT', DEADLINES, at, option)
    end
    expire_no_sooner(INDEX, at)
    expire_no_sooner(NAMES, at)
  end
  return L.n > 0 and L.e or 0
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

-- Every function of the library starts here: this call's keys and
-- arguments, and nothing left over from the call before.
local function enter(keys, args)
  KEYS, ARGV = keys, args
  if #keys == 3 then
    LOCK, QUEUE, DEADLINES = nil, nil, nil
    INDEX, NAMES, FENCE = keys[1], keys[2], keys[3]
  else
    LOCK, QUEUE, DEADLINES, INDEX, NAMES, FENCE = keys[1], keys[2], keys[3], keys[4], keys[5], keys[6]
  end
  LOCK_NAME, WAKE_CHANNEL = args[1], args[2]
  SHARD = string.sub(INDEX, 1, -7)
  EVENTS_CHANNEL = string.gsub(WAKE_CHANNEL or '', 'wake$', 'events')
  NOW_MS, L = 0, nil
end

-- The operation's own steps follow, as the body of its function.

-- common.lua: the prelude every tumbler script starts with (tumbler joins it
-- in front of each operation script before loading). It holds the steps
-- that several operations share, so each operation reads top to bottom.
--
-- Layout of one lock (all keys share the shard's hash tag, so one script
-- touches one cluster slot):
--   holders ZSET  holder id -> lease expiry (ms, Redis clock)
--   info    HASH  'g:<holder>' -> grant record, 's:<slot>' -> holder,
--                 'limit' -> limit of the latest grant
--   index   ZSET  (per shard) lock name -> earliest lease expiry in it
--   fence   STRING (per shard) last fencing token
-- A grant record is 'token|slot|acquired_at_ms|ttl_ms|kind|metadata_json'.

-- How long an idle shard keeps its fencing counter. Losing it is safe:
-- tokens never fall below the Redis clock in microseconds (next_token).
local FENCE_IDLE_TTL_MS = 7 * 24 * 3600 * 1000

-- The Redis clock, in milliseconds and in microseconds since the epoch.
local function redis_now()
  local t = redis.call('TIME')
  local secs, micros = tonumber(t[1]), tonumber(t[2])
  return secs * 1000 + math.floor(micros / 1000), secs * 1000000 + micros
end

-- The fencing token inside a grant record, as the decimal string it was
-- written as (compared as text: no float rounding).
local function record_token(record)
  return string.match(record, '^(%d+)|')
end

-- The slot number inside a grant record.
local function record_slot(record)
  return string.match(record, '^%d+|(%d+)|')
end

-- Remove one holder's grant: its record, its slot and its lease.
local function drop_grant(holders_key, info_key, holder, record)
  redis.call('HDEL', info_key, 'g:' .. holder, 's:' .. record_slot(record))
  redis.call('ZREM', holders_key, holder)
end

-- Holders whose lease has passed stop counting now: drop their grants.
-- Returns how many were dropped.
local function purge_expired(holders_key, info_key, now)
  local expired = redis.call('ZRANGEBYSCORE', holders_key, '-inf', now)
  for _, holder in ipairs(expired) do
    local record = redis.call('HGET', info_key, 'g:' .. holder)
    if record then
      drop_grant(holders_key, info_key, holder, record)
    else
      redis.call('ZREM', holders_key, holder)
    end
  end
  return #expired
end

-- After any change: a lock nobody holds leaves no key behind; otherwise
-- both keys expire with the last lease (so Redis cleans up even if nothing
-- touches the lock again) and the shard index records the earliest expiry.
-- Returns the earliest lease expiry, or 0 when the lock is gone.
local function settle(holders_key, info_key, index_key, name)
  local last = redis.call('ZRANGE', holders_key, -1, -1, 'WITHSCORES')
  if #last == 0 then
    redis.call('DEL', holders_key, info_key)
    redis.call('ZREM', index_key, name)
    return 0
  end
  local first = redis.call('ZRANGE', holders_key, 0, 0, 'WITHSCORES')
  redis.call('PEXPIREAT', holders_key, last[2])
  redis.call('PEXPIREAT', info_key, last[2])
  redis.call('ZADD', index_key, first[2], name)
  -- The index lives as long as its longest-lived lock: a fresh index has no
  -- TTL yet (GT would refuse it), an existing one only ever grows its TTL.
  if redis.call('PTTL', index_key) < 0 then
    redis.call('PEXPIREAT', index_key, last[2])
  else
    redis.call('PEXPIREAT', index_key, last[2], 'GT')
  end
  return tonumber(first[2])
end

-- The next fencing token of the shard: one more than the last one, and
-- never below the Redis clock in microseconds. A lost counter (restart
-- without persistence, failover to a lagging replica) therefore resumes
-- above every token it handed out, as long as the clock moves forward.
local function next_token(fence_key, now_us)
  local last = tonumber(redis.call('GET', fence_key) or '0')
  if last < now_us then
    redis.call('SET', fence_key, string.format('%d', now_us))
  end
  local token = redis.call('INCR', fence_key)
  redis.call('PEXPIRE', fence_key, FENCE_IDLE_TTL_MS)
  return token
end

-- The script of the operation follows.

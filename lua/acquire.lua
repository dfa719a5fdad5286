-- acquire: take one of `limit` permits of a lock for a holder, or, when the
-- caller waits, hold its place in the lock's queue.
-- ARGV: 3 holder, 4 limit, 5 ttl_ms, 6 kind, 7 metadata JSON,
--       8 mode ('try' once | 'wait'), 9 fair ('1' | '0'), 10 priority,
--       11 queue_ttl_ms, 12 wait left (ms), 13 max waiters per lock,
--       14 max locks of the namespace in this shard ('0' = no limit)
-- Returns {status, grant record, expires_at, holders, next_expiry, position, now}
--   status 1 = acquired, 2 = already held (the existing grant),
--          0 = not granted (position > 0: queued at that place), -1 = queue full,
--          -2 = the namespace has no room for another lock in this shard
local holder, limit, ttl = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local waiting, fair, priority = ARGV[8] == 'wait', ARGV[9] == '1', tonumber(ARGV[10])
local now, now_us = redis_now()
load_lock(holder)

-- 1. Expired leases and dead waiters stop counting before anything is decided.
local changed = purge_expired(now) + purge_dead_waiters(now) > 0

-- 2. A holder with a live grant gets that same grant back (idempotent retry).
if L.mine then
  if changed then
    settle()
    wake_eligible()
  end
  return {2, L.mine, L.mine_expires, L.n, 0, 0, now}
end

-- 2b. A lock this shard does not know yet counts against the namespace's
--     lock limit; at the limit it is refused before anything is written.
local max_locks = tonumber(ARGV[14])
if max_locks > 0 and not L.exists and redis.call('ZCARD', NAMES) >= max_locks then
  return {-2, '', 0, 0, 0, 0, now}
end

-- 3. Its place: how many live requests go before it. Fair requests queue
--    behind everyone of their priority or higher; barging ones do not.
local held = L.n
local free = limit - held
local queued_order = queue_head() and redis.call('ZSCORE', QUEUE, holder)
local ahead = 0
if fair and queued_order then
  ahead = redis.call('ZCOUNT', QUEUE, '-inf', '(' .. queued_order)
elseif fair and queue_head() then
  ahead = redis.call('ZCOUNT', QUEUE, '-inf', '(' .. int((PRIORITY_MAX - priority + 1) * ARRIVALS))
end

-- 4. A free permit and nobody ahead: grant, with a fresh token and the
--    smallest free slot (with `held` slots taken, one of 1..held+1 is free).
--    Only the head of the queue is granted, so grants follow queue order
--    exactly, for semaphores too.
if free > 0 and ahead == 0 then
  if queued_order then
    drop_waiter(holder)
  end
  local slot = 1
  if held > 0 then
    flush_removed()
    local fields = {}
    for s = 1, held + 1 do
      fields[s] = 's:' .. int(s)
    end
    for s, taken in ipairs(hmget_all(fields)) do
      if not taken then
        slot = s
        break
      end
    end
  end
  local token = next_token(now_us)
  local expires = now + ttl
  local record = string.format('%d|%d|%d|%d|%s|%s', token, slot, now, ttl, ARGV[6], ARGV[7])
  L.n, L.limit, L.top = held + 1, limit, math.max(L.top, slot)
  put_grant(holder, expires, record)
  change('s:' .. int(slot), holder)
  change('n', int(L.n))
  change('top', int(L.top))
  change('limit', ARGV[4])
  local next_expiry = settle()
  count(ARGV[6], 'acquired')
  emit('acquired', holder, int(token))
  -- A permit left over goes to the next waiter in line.
  if free > 1 then
    wake_eligible()
  end
  return {1, record, expires, L.n, next_expiry, 0, now}
end

-- 5. Not granted, trying once: nothing is queued.
if not waiting then
  count(ARGV[6], 'denied')
  local next_expiry = L.n > 0 and L.e or 0
  if changed then
    next_expiry = settle()
    wake_eligible()
  end
  return {0, '', 0, held, next_expiry, 0, now}
end

-- 6. Not granted, waiting: join the queue once (arrival order from the
--    lock's counter), then keep the request alive for queue_ttl_ms.
if not queued_order then
  if queue_head() and redis.call('ZCARD', QUEUE) >= tonumber(ARGV[13]) then
    if changed then
      settle()
      wake_eligible()
    end
    return {-1, '', 0, held, 0, 0, now}
  end
  L.queue_fresh = not queue_head()
  local arrival = redis.call('HINCRBY', LOCK, 'seq', '1')
  L.may_wait = true
  redis.call('ZADD', QUEUE, int((PRIORITY_MAX - priority) * ARRIVALS + arrival), holder)
  local wait_deadline = now + tonumber(ARGV[12])
  redis.call('HSET', LOCK, 'w:' .. holder,
    string.format('%d|%d|%d|%s|%s', priority, now, wait_deadline, fair and '1' or '0', ARGV[6]))
  queue_changed()
  emit('queued', holder)
end
local deadline = now + tonumber(ARGV[11])
redis.call('ZADD', DEADLINES, int(deadline), holder)
keep_keys_until(deadline)

-- 7. Key TTLs, the index, and a wake-up when expiries freed permits.
local next_expiry = settle()
if changed then
  wake_eligible()
end
return {0, '', 0, held, next_expiry, redis.call('ZRANK', QUEUE, holder) + 1, now}

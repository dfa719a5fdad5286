-- dequeue: a waiting request leaves the queue (its RPC timed out or was
-- cancelled).
-- ARGV: 3 request id, 4 why ('timeout' is counted as timed_out; 'cancel' is not)
-- Returns the position it had (1-based), or 0 when it was not queued.
local id = ARGV[3]
local now = redis_now()
load_lock()

-- 1. Expired leases and dead waiters leave too.
purge_expired(now)
purge_dead_waiters(now)

-- 2. Leave the queue.
local rank = queue_head() and redis.call('ZRANK', QUEUE, id)
if rank then
  if ARGV[4] == 'timeout' then
    count(waiter_kind(redis.call('HGET', LOCK, 'w:' .. id)), 'timed_out')
  end
  emit('dequeued', id)
  drop_waiter(id)
end

-- 3. Key TTLs and the index; whoever moves up may now be granted.
settle()
wake_eligible()
return rank and rank + 1 or 0

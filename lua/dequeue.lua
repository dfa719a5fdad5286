-- dequeue: a waiting request leaves the queue (its RPC timed out or was
-- cancelled).
-- KEYS: the lock's (lock, queue, deadlines, waiters, fence[, live locks])
-- ARGV: request id, event flags ('0' = none; common.lua `events`)
-- Returns {now, the position it had (1-based; 0 = it was not queued),
--          the kind it waited as, events...}
local id, watched = unpack(ARGV, 1, 2)
local now = clock_ms()
local L = load(lock_at(KEYS), nil, watched)

-- 1. Expired leases and dead waiters leave too.
purge(L, now)

-- 2. Leave the queue.
local rank = queue_head(L) and redis.call('ZRANK', L.queue, id)
local kind = ''
if rank then
  kind = waiter_kind(redis.call('HGET', L.waiters, id))
  if L.watched then
    emit(L, 'dequeued', id, {kind = kind}, now, HOLDER)
  end
  drop_waiters(L, {id})
end

-- 3. Key TTLs; whoever moves up may now be granted.
settle(L)
wake_eligible(L)
return {now, rank and rank + 1 or 0, kind, unpack(L.events)}

-- dequeue: a waiting request leaves the queue (its RPC timed out or was
-- cancelled).
-- KEYS: the lock's (lock, queue, fence[, live locks])
-- ARGV: holder, event flags ('0' = none; shared/lock.lua `events`), then the
--       request that leaves (its RPC's id, as acquire stored it; absent or
--       '' = whichever request holds the place)
-- Returns {now, the position it had (1-based; 0 = it was not queued, or
--          its place now belongs to another request of the holder),
--          the kind it waited as, events...}
local id, watched, request = unpack(ARGV, 1, 3)
local now, now_us = clock()
local L = load(lock_at(KEYS), nil, watched)
L.now, L.now_us = now, now_us

-- 1. Expired leases and dead waiters leave too.
purge(L, now)

-- 2. Leave the queue, when the place is this request's: a later request
--    of the same holder that took the place over keeps it (finding 6).
local rank = queue_head(L) and redis.call('ZRANK', L.queue, id)
local kind = ''
if rank then
  local _, record = split_waiter(waiter_of(L, id))
  local owner = waiter_request(record)
  if request and request ~= '' and owner ~= '' and owner ~= request then
    rank = nil
  else
    kind = waiter_kind(record)
    if L.watched then
      emit(L, 'dequeued', id, {kind = kind, mode = waiter_mode(record)}, now, HOLDER)
    end
    drop_waiters(L, {id})
  end
end

-- 3. Key TTLs; whoever moves up may now be granted.
hand_over(L)
settle(L)
return {now, rank and rank + 1 or 0, kind, unpack(L.events)}

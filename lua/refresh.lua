-- refresh: keep one replica's waiting requests on a lock alive while their
-- RPCs are open, and clear out what died meanwhile.
-- ARGV: 3.. pairs of (request id, queue_ttl_ms)
-- Returns the ids that are no longer queued (their place was lost).
local now = redis_now()

-- 1. Expired leases and dead waiters (other replicas' too) leave.
purge_expired(now)
purge_dead_waiters(now)

-- 2. Each live request of this replica gets a new liveness deadline.
local lost = {}
for k = 3, #ARGV, 2 do
  local id = ARGV[k]
  if redis.call('ZADD', DEADLINES, 'XX', 'CH', now + tonumber(ARGV[k + 1]), id) == 0
      and not redis.call('ZSCORE', DEADLINES, id) then
    table.insert(lost, id)
  end
end

-- 3. Key TTLs and the index; and a wake-up for whoever may be granted, in
--    case a notification was lost.
settle()
wake_eligible()
return lost

-- refresh: keep one replica's waiting requests on a lock alive while their
-- RPCs are open, and clear out what died meanwhile.
-- ARGV: 3.. pairs of (request id, queue_ttl_ms)
-- Returns the ids that are no longer queued (their place was lost).
local now = redis_now()
load_lock()

-- 1. Expired leases and dead waiters (other replicas' too) leave.
purge_expired(now)
purge_dead_waiters(now)

-- 2. Each live request of this replica gets a new liveness deadline: per
--    batch of ids, one ZMSCORE finds those no longer queued (lost) and one
--    ZADD XX moves the deadlines of the rest (XX never re-adds a lost one).
--    Batches keep the argument lists well inside Lua's stack.
local lost = {}
for first = 3, #ARGV, 2 * BATCH do
  local last = math.min(first + 2 * BATCH - 1, #ARGV)
  local ids, deadlines = {}, {}
  for k = first, last, 2 do
    local deadline = now + tonumber(ARGV[k + 1])
    table.insert(ids, ARGV[k])
    table.insert(deadlines, int(deadline))
    table.insert(deadlines, ARGV[k])
    keep_keys_until(deadline)
  end
  local scores = queue_head() and redis.call('ZMSCORE', DEADLINES, unpack(ids)) or {}
  local kept = 0
  for i, id in ipairs(ids) do
    if not scores[i] then
      table.insert(lost, id)
    else
      kept = kept + 1
    end
  end
  if kept > 0 then
    redis.call('ZADD', DEADLINES, 'XX', unpack(deadlines))
  end
end

-- 3. Key TTLs and the index; and a wake-up for whoever may be granted, in
--    case a notification was lost.
settle()
wake_eligible()
return lost

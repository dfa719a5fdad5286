-- refresh: keep one replica's waiting requests on a lock alive while their
-- RPCs are open, and clear out what died meanwhile.
-- KEYS: the lock's (lock, queue, deadlines, waiters, fence[, live locks])
-- ARGV: event flags ('0' = none; shared/lock.lua `events`), then pairs of (request id, queue_ttl_ms)
-- Returns {now, ids no longer queued (their place was lost)..., '', events...}
local watched = ARGV[1]
local now, now_us = clock()
local L = load(lock_at(KEYS), nil, watched)
L.now, L.now_us = now, now_us

-- 1. Expired leases and dead waiters (other replicas' too) leave.
purge(L, now)

-- 2. Each live request of this replica gets a new liveness deadline: per
--    batch of ids, one ZMSCORE finds those no longer queued (lost) and one
--    ZADD XX moves the deadlines of the rest (XX never re-adds a lost one).
--    Batches keep the argument lists well inside Lua's stack.
-- A grant handed to `holder` and not yet claimed (the lock's 'r:<holder>';
-- a provisional one's lease cut at the request's liveness deadline:
-- shared/permits.lua `hand_over`) lives on with its liveness: this
-- replica, alive, still waits for it, and wakes its request to take it
-- up (named below as no longer queued, it calls again and is answered
-- HELD). A lease that ends later than the holder counts never harms it.
-- A dead replica renews nothing, so its waiter's grant lapses within its
-- request TTL.
local function live_on(L, holder, deadline)
  local read = redis.call('HMGET', L.key, 'h:' .. holder, 'r:' .. holder)
  if not read[1] or not read[2] then
    return
  end
  local g = parse_grant(holder, read[1])
  if g.expires < deadline then
    g.expires, g.expires_s = deadline, false
    put_grant(L, g)
  end
end

local reply = {now}
for first = 2, #ARGV, 2 * BATCH do
  local last = math.min(first + 2 * BATCH - 1, #ARGV)
  local ids, deadlines = {}, {}
  for k = first, last, 2 do
    local deadline = now + tonumber(ARGV[k + 1])
    table.insert(ids, ARGV[k])
    table.insert(deadlines, int(deadline))
    table.insert(deadlines, ARGV[k])
    keep_keys_until(L, deadline)
  end
  local scores = queue_head(L) and redis.call('ZMSCORE', L.deadlines, unpack(ids)) or {}
  local kept = 0
  for i, id in ipairs(ids) do
    if not scores[i] then
      table.insert(reply, id)
      live_on(L, id, tonumber(deadlines[2 * i - 1]))
    else
      kept = kept + 1
    end
  end
  if kept > 0 then
    redis.call('ZADD', L.deadlines, 'XX', unpack(deadlines))
  end
end

-- 3. Whoever may be granted is (a lost notification is made good), and
--    key TTLs.
hand_over(L)
settle(L)
table.insert(reply, '')
for _, item in ipairs(L.events) do
  table.insert(reply, item)
end
return reply

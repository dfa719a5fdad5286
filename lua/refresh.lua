-- refresh: keep one replica's waiting requests on a lock alive while their
-- RPCs are open, and clear out what died meanwhile.
-- KEYS: the lock's (lock, queue, fence[, live locks])
-- ARGV: event flags ('0' = none; shared/lock.lua `events`), then pairs of (request id, queue_ttl_ms)
-- Returns {now, ids no longer queued (their place was lost)..., '', events...}
local watched = ARGV[1]
local now, now_us = clock()
local L = load(lock_at(KEYS), nil, watched)
L.now, L.now_us = now, now_us

-- 1. Expired leases and dead waiters (other replicas' too) leave.
purge(L, now)

-- 2. Each live request of this replica gets a new liveness deadline: per
--    batch of ids, one HMGET of their fields in the lock's hash finds
--    those no longer queued (lost); the rest are written back with the
--    new deadline in settle's one HSET (a lost one is never re-added).
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
-- (A request the purge just took out is lost too: its field goes at settle.)
local gone = {}
for _, field in ipairs(L.removed) do
  gone[field] = true
end
for first = 2, #ARGV, 2 * BATCH do
  local last = math.min(first + 2 * BATCH - 1, #ARGV)
  local ids, deadlines, fields = {}, {}, {}
  for k = first, last, 2 do
    local deadline = now + tonumber(ARGV[k + 1])
    ids[#ids + 1], deadlines[#deadlines + 1] = ARGV[k], deadline
    fields[#fields + 1] = waiter_field(ARGV[k])
    keep_keys_until(L, deadline)
  end
  local stored = queue_head(L) and redis.call('HMGET', L.key, unpack(fields)) or {}
  for i, id in ipairs(ids) do
    if not stored[i] or gone[fields[i]] then
      table.insert(reply, id)
      live_on(L, id, deadlines[i])
    else
      local _, record = split_waiter(stored[i])
      change(L, fields[i], stored_waiter(int(deadlines[i]), record))
    end
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

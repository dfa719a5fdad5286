-- flags: no-writes (reads only: Redis runs it even while it refuses writes)
-- queue: a lock's live waiting requests in grant order. Reads only: dead
-- requests are left out here and purged by the next write.
-- KEYS: the lock's (lock, queue, deadlines, waiters, fence[, live locks])
-- ARGV: most entries to return
-- Returns {now, live waiters, {{id, liveness deadline, waiter record}, ...}}
local most = tonumber(ARGV[1])
local now = clock_ms()
local L = lock_at(KEYS)

-- 1. Walk the queue in order, skipping requests whose replica went quiet.
local entries, live = {}, 0
local ids = redis.call('ZRANGE', L.queue, '0', '-1')
for first = 1, #ids, BATCH do
  local last = math.min(first + BATCH - 1, #ids)
  local deadlines = redis.call('ZMSCORE', L.deadlines, unpack(ids, first, last))
  local wanted, fields = {}, {}
  for i = first, last do
    local deadline = tonumber(deadlines[i - first + 1] or '0')
    if deadline > now then
      live = live + 1
      if #entries + #wanted < most then
        table.insert(wanted, {ids[i], deadline})
        table.insert(fields, ids[i])
      end
    end
  end
  if #fields > 0 then
    local records = redis.call('HMGET', L.waiters, unpack(fields))
    for i, entry in ipairs(wanted) do
      table.insert(entries, {entry[1], entry[2], records[i] or ''})
    end
  end
end
return {now, live, entries}

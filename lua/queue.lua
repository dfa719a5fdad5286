-- queue: a lock's live waiting requests in grant order. Reads only: dead
-- requests are left out here and purged by the next write.
-- ARGV: 3 most entries to return
-- Returns {now, live waiters, {{id, liveness deadline, waiter record}, ...}}
local most = tonumber(ARGV[3])
local now = redis_now()

-- 1. Walk the queue in order, skipping requests whose replica went quiet.
local entries, live = {}, 0
for _, id in ipairs(redis.call('ZRANGE', QUEUE, '0', '-1')) do
  local deadline = tonumber(redis.call('ZSCORE', DEADLINES, id) or '0')
  if deadline > now then
    live = live + 1
    if #entries < most then
      table.insert(entries, {id, deadline, redis.call('HGET', LOCK, 'w:' .. id) or ''})
    end
  end
end
return {now, live, entries}

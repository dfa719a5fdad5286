-- clear: release every lock of one shard and drop its queues (an admin
-- operation), one batch of locks per call.
-- KEYS: 1 index, 2 names, 3 fence (a shard script)
-- ARGV: 3 shard key prefix, 4 most locks per call
-- Returns {locks cleared, grants released, requests dropped, 1 if more remain}
local shard = ARGV[3]
local locks, grants, requests = 0, 0, 0

-- 1. The first locks by name (each call removes what it visits).
for _, name in ipairs(redis.call('ZRANGE', NAMES, '0', int(tonumber(ARGV[4]) - 1))) do
  use_lock(shard, name)
  -- 2. Count what goes, then delete the lock's keys and index entries.
  grants = grants + tonumber(redis.call('HGET', LOCK, 'n') or '0')
  requests = requests + redis.call('ZCARD', QUEUE)
  redis.call('DEL', LOCK, QUEUE, DEADLINES)
  redis.call('ZREM', INDEX, name)
  redis.call('ZREM', NAMES, name)
  locks = locks + 1
end

-- 3. Index entries without a name entry (should not exist) go too.
if redis.call('ZCARD', NAMES) == 0 then
  redis.call('DEL', INDEX)
end
return {locks, grants, requests, redis.call('ZCARD', NAMES) > 0 and 1 or 0}

-- clear: release every lock of some of one shard's locks and drop their
-- queues (an admin operation; the replica found their keys with SCAN).
-- KEYS[1] the shard's fence key (a shard function)
-- ARGV: watched ('1' = publish events), then lock names
-- Returns {locks cleared, grants released, requests dropped}
local watched = ARGV[1]
local now = clock_ms()
local shard = split_key(KEYS[1])
local locks, grants, requests = 0, 0, 0

for k = 2, #ARGV do
  local L = load(lock_of(shard, ARGV[k]), nil, watched)
  if L.exists then
    -- 1. Count what goes (and tell watchers), then delete the lock's keys.
    for _, grant in ipairs(all_grants(L)) do
      emit(L, 'cleared', grant.holder, grant.token, now)
    end
    grants = grants + L.n
    if L.seq > 0 then
      requests = requests + redis.call('ZCARD', L.queue)
    end
    redis.call('DEL', L.key, L.queue, L.deadlines, L.waiters)
    redis.call('ZREM', shard .. ':n', L.name)
    locks = locks + 1
  end
end
return {locks, grants, requests}

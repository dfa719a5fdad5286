-- renew: keep the grants of sessions alive, many locks of one shard per
-- call (a replica renews all its session grants with one call per shard).
-- KEYS[1] the shard's fence key (a shard function)
-- ARGV: answer_by (Redis ms; '0' = none), live ('1' = the shard's live
--       locks are counted), event flags ('0' = none; common.lua `events`), then groups of
--       (lock name, holder, fencing token, ttl_ms)
-- Returns {status, now, lost group numbers (1-based)..., events...}:
--   status OK, or LATE (nothing renewed). The events follow a '' marker.
local answer_by, live, watched = unpack(ARGV, 1, 3)
local now = clock_ms()
if late(answer_by, now) then
  return {LATE, now}
end
local shard = split_key(KEYS[1])
local reply, events = {OK, now}, {}

for k = 4, #ARGV, 4 do
  local name, holder, token, ttl = ARGV[k], ARGV[k + 1], ARGV[k + 2], tonumber(ARGV[k + 3])
  local L = load(lock_of(shard, name, live == '1'), holder, watched)
  -- 1. A lease that already passed is not brought back.
  local changed = purge(L, now)
  -- 2. Only the same grant (holder and token) is renewed; it keeps the ttl
  --    it was granted with.
  local grant = mine(L)
  if grant and grant.token == token then
    grant.expires, grant.expires_s = now + ttl, nil
    put_grant(L, grant)
    settle(L)
    emit(L, 'extended', holder, grant, now, HOLDER)
  else
    table.insert(reply, (k - 4) / 4 + 1)
    if L.watched then
      emit(L, 'lost', holder, {token = token}, now, HOLDER)
    end
    settle_purged(L, changed)
  end
  for _, item in ipairs(L.events) do
    table.insert(events, item)
  end
end
table.insert(reply, '')
for _, item in ipairs(events) do
  table.insert(reply, item)
end
return reply

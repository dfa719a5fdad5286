-- renew: keep the grants of sessions alive, many locks of one shard per
-- call (a replica renews all its session grants with one call per shard).
-- KEYS[1] the shard's fence key (a shard function)
-- ARGV: answer_by (Redis ms; '0' = none), live ('1' = the shard's live
--       locks are counted), event flags ('0' = none; shared/lock.lua `events`), then groups of
--       (lock name, holder, fencing token, ttl_ms, epoch of the renewing stream)
-- Returns {status, now, lost group numbers (1-based)..., events...}:
--   status OK, or LATE (nothing renewed). A group whose grant a newer
--   stream of its session holds (shared/records.lua `stale`) is answered with its
--   number negated (-n: moved, nothing changed); a renewal with a later
--   epoch than the grant's takes the grant over (a resume). The events
--   follow a '' marker.
local answer_by, live, watched = unpack(ARGV, 1, 3)
local now, now_us = clock()
if late(answer_by, now_us) then
  return {LATE, now}
end
local shard = split_key(KEYS[1])
local reply, events = {OK, now}, {}

for k = 4, #ARGV, 5 do
  local name, holder, token, ttl, epoch = ARGV[k], ARGV[k + 1], ARGV[k + 2], tonumber(ARGV[k + 3]), ARGV[k + 4]
  local group = (k - 4) / 5 + 1
  local L = load(lock_of(shard, name, live == '1'), holder, watched)
  -- 1. A lease that already passed is not brought back.
  local changed = purge(L, now)
  -- 2. Only the same grant (holder and token) is renewed; it keeps the ttl
  --    it was granted with.
  local grant = mine(L)
  if grant and grant.token == token and stale(grant, epoch) then
    table.insert(reply, -group)
    settle_purged(L, changed)
  elseif grant and grant.token == token then
    claim_epoch(grant, epoch)
    grant.expires, grant.expires_s = now + ttl, nil
    put_grant(L, grant)
    settle(L)
    emit(L, 'extended', holder, grant, now, HOLDER)
  else
    table.insert(reply, group)
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

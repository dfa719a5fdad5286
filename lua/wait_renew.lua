-- wait_renew: the edges a replica keeps alive in one namespace's wait-for
-- registry while their holders wait (decision 0081), all in one call every
-- third of their life: an edge nobody renews (its replica died) leaves
-- within its queue TTL, as its waiting request does.
-- KEYS[1] the namespace's registry (see wait_for.lua)
-- ARGV: per edge, the holder, its request id, how long it lives from now (ms)
-- Returns the number of edges renewed (one gone, or a newer request's, is
--   left alone).
local registry = KEYS[1]
local now = clock_ms()

-- 1. One random edge swept if its liveness is over (renewals go on while
-- anyone waits: they keep a dead replica's edges from lingering).
waits_sweep(registry, 1, now)

local renewed, longest = 0, 0
for at = 1, #ARGV, 3 do
  local holder, request, live = ARGV[at], ARGV[at + 1], tonumber(ARGV[at + 2])
  -- 2. Only the request that wrote an edge renews it.
  local text = redis.call('HGET', registry, holder)
  local _, written_by, waits
  if text then
    _, written_by, waits = waits_edge(text)
  end
  if written_by == request then
    -- 3. Its end moved on (the byte count follows the new text; its
    -- waits are copied, never decoded).
    waits_put(registry, holder, waits_encode(now + live, request, waits))
    renewed = renewed + 1
    longest = math.max(longest, live)
  end
end

-- 4. The registry lives as long as its longest-lived edge (plus a second).
if renewed > 0 and redis.call('PTTL', registry) < longest + 1000 then
  redis.call('PEXPIRE', registry, int(longest + 1000))
end
return renewed

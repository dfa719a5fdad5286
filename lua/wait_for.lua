-- wait_for: a waiting holder's edge in its namespace's wait-for registry
-- (decision 0077), and the walk that finds whether it closes a cycle; bounded
-- in bytes and in Redis time (decision 0081).
-- KEYS[1] the namespace's registry ('<prefix>:{<ns>:waits}', a HASH
--   waiting holder -> its edge, '<end of its liveness ms>|<request>|<waits>'
--   with waits the cjson of {{lock, {holder, ...}}, ...}: the locks it waits
--   for and at most 16 of the holders it waits on there, as its replica
--   read them; field '' the bytes of the rest, see shared/wait_registry.lua's waits_put)
-- ARGV: waiting holder, its request id, how long the edge lives unless
--   renewed (ms: its queue TTL, or what is left of its wait if shorter), the
--   registry's budget (bytes), the most bytes a walk decodes, then per lock
--   waited for: the lock's name, the number of holders, the holders
-- Returns {now, status, then, when status is 1, per step of the cycle found,
--   from the waiting holder round to it again: holder, lock, holder it waits
--   on}; status 0 no cycle, 1 a cycle, 2 not recorded (the registry is at its
--   budget: this wait is not checked)
local registry = KEYS[1]
local waiter, request, live = ARGV[1], ARGV[2], tonumber(ARGV[3])
local budget, most_bytes = tonumber(ARGV[4]), tonumber(ARGV[5])
local now = clock_ms()
local MOST_VISITED = 256

-- 1. The edge as this call records it (at most 16 holders per lock: the
-- engine's cut, so no unpack of an unbounded list).
local waits, at = {}, 6
while at <= #ARGV do
  local lock, count = ARGV[at], tonumber(ARGV[at + 1])
  local holders = {}
  for i = 1, math.min(count, 16) do
    holders[i] = ARGV[at + 1 + i]
  end
  waits[#waits + 1] = {lock, holders}
  at = at + 2 + count
end
local mine = {w = waits}

-- 2. A couple of random edges swept when their liveness is over.
waits_sweep(registry, 2, now)

-- 3. Recorded only within the namespace's budget (swept harder once it
-- would pass it); past it, the wait goes on unchecked (its old edge, if
-- any, leaves: it no longer says where it waits).
local text = waits_encode(now + live, request, cjson.encode(waits))
local used, old = waits_bytes_with(registry, waiter, text)
if used > budget then
  waits_sweep(registry, 16, now)
  used, old = waits_bytes_with(registry, waiter, text)
  if used > budget then
    waits_put(registry, waiter, nil)
    return {now, 2}
  end
end
waits_put(registry, waiter, text, used, old)

-- 4. The registry lives as long as its longest-lived edge (plus a second),
-- so a dead replica's edges leave with it when nobody else waits.
if redis.call('PTTL', registry) < live + 1000 then
  redis.call('PEXPIRE', registry, int(live + 1000))
end

-- 5. The edge of one holder, nil when it waits for nothing (an edge past
-- its end is removed on the way); each read counts against the walk's bytes.
local decoded = 0
local function edge_of(holder)
  if holder == waiter then
    return mine
  end
  local edge_text = redis.call('HGET', registry, holder)
  if not edge_text then
    return nil
  end
  local e, _, edge_waits = waits_edge(edge_text)
  if e <= now then
    waits_put(registry, holder, nil)
    return nil
  end
  decoded = decoded + #edge_waits
  return {w = cjson.decode(edge_waits)}
end

-- 6. Breadth first from the waiting holder along the edges, within
-- MOST_VISITED holders and `most_bytes` decoded (past either, a cycle is
-- missed, never invented); reaching it again closes a cycle, read back
-- through the parents.
local parent = {[waiter] = false}
local frontier, head = {waiter}, 1
while head <= #frontier and head <= MOST_VISITED and decoded <= most_bytes do
  local holder = frontier[head]
  head = head + 1
  local edge = edge_of(holder)
  for _, wait in ipairs(edge and edge.w or {}) do
    local lock, holders = wait[1], wait[2]
    for _, other in ipairs(holders) do
      if other == waiter then
        local steps, from, via = {}, holder, lock
        while from do
          table.insert(steps, 1, {from, via, #steps == 0 and waiter or steps[1][1]})
          local back = parent[from]
          from, via = back and back[1], back and back[2]
        end
        local flat = {now, 1}
        for _, step in ipairs(steps) do
          flat[#flat + 1], flat[#flat + 2], flat[#flat + 3] = step[1], step[2], step[3]
        end
        return flat
      end
      if parent[other] == nil then
        parent[other] = {holder, lock}
        frontier[#frontier + 1] = other
      end
    end
  end
end
return {now, 0}

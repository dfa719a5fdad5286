-- wait_for: a waiting holder's edges in its namespace's wait-for registry
-- (decision 0077), and the walk that finds whether they close a cycle.
-- KEYS[1] the namespace's registry ('<prefix>:{<ns>:waits}', a HASH
--   waiting holder -> its edge, cjson {r = request, e = expiry ms,
--   w = {{lock, {holder, ...}}, ...}}: the locks it waits for and the
--   holders it waits on there, as its replica read them)
-- ARGV: waiting holder, its request id, how long it still waits (ms), then
--   per lock waited for: the lock's name, the number of holders, the holders
-- Returns {now, found (0/1), then per step of the cycle found, from the
--   waiting holder round to it again: holder, lock, holder it waits on}
local registry = KEYS[1]
local waiter, request, left = ARGV[1], ARGV[2], tonumber(ARGV[3])
local now = clock_ms()
local MOST_VISITED = 256

-- 1. The edge as this call records it (the argument list unpacked).
local waits, at = {}, 4
while at <= #ARGV do
  local lock, count = ARGV[at], tonumber(ARGV[at + 1])
  waits[#waits + 1] = {lock, {unpack(ARGV, at + 2, at + 1 + count)}}
  at = at + 2 + count
end
local mine = {r = request, e = now + left, w = waits}
redis.call('HSET', registry, waiter, cjson.encode(mine))

-- 2. The registry lives as long as its longest wait (plus a minute).
if redis.call('PTTL', registry) < left + 60000 then
  redis.call('PEXPIRE', registry, int(left + 60000))
end

-- 3. A couple of random edges swept when their wait is over (a replica
-- that crashed never removed them).
for _, holder in ipairs(redis.call('HRANDFIELD', registry, 2)) do
  local edge = cjson.decode(redis.call('HGET', registry, holder))
  if edge.e <= now then
    redis.call('HDEL', registry, holder)
  end
end

-- 4. The edges of one holder, nil when it waits for nothing (an edge past
-- its end is deleted on the way).
local function edges_of(holder)
  if holder == waiter then
    return mine
  end
  local text = redis.call('HGET', registry, holder)
  if not text then
    return nil
  end
  local edge = cjson.decode(text)
  if edge.e <= now then
    redis.call('HDEL', registry, holder)
    return nil
  end
  return edge
end

-- 5. Breadth first from the waiting holder along the edges; reaching it
-- again closes a cycle, read back through the parents.
local parent = {[waiter] = false}
local frontier, head, visited = {waiter}, 1, 0
while head <= #frontier and visited < MOST_VISITED do
  local holder = frontier[head]
  head, visited = head + 1, visited + 1
  local edge = edges_of(holder)
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

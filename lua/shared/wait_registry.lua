-- shared/wait_registry.lua: a namespace's wait-for registry (deadlock
-- detection), shared by blockers, wait_for, wait_renew, wait_end and
-- waits.

-- A namespace's wait-for registry (decision 0077, bounded by decision 0081):
-- a HASH of waiting holder -> edge (waits_edge), whose field '' (never a
-- holder: a holder is not empty) keeps the bytes of every other field and
-- value, so the budget is checked in O(1).
local WAITS_BYTES = ''

-- The registry's bytes once `holder`'s edge is `text` (nil: removed).
local function waits_bytes_with(registry, holder, text)
  local used = tonumber(redis.call('HGET', registry, WAITS_BYTES) or '0')
  local old = redis.call('HSTRLEN', registry, holder)
  if old > 0 then
    used = used - old - #holder
  end
  return used + (text and #text + #holder or 0), old
end

-- `holder`'s edge written (`text`) or removed (nil), the byte count kept
-- (`used` and `old`: what waits_bytes_with answered for it, when known).
local function waits_put(registry, holder, text, used, old)
  if not used then
    used, old = waits_bytes_with(registry, holder, text)
  end
  if text then
    redis.call('HSET', registry, holder, text, WAITS_BYTES, int(math.max(used, 0)))
  elseif old > 0 then
    redis.call('HDEL', registry, holder)
    if redis.call('HLEN', registry) <= 1 then
      redis.call('DEL', registry) -- nobody waits: no key stays
    else
      redis.call('HSET', registry, WAITS_BYTES, int(math.max(used, 0)))
    end
  end
end

-- An edge is '<end ms>|<request id>|<waits as JSON>': its end and request
-- are read without decoding its waits (renewals and sweeps never decode).
local function waits_edge(text)
  local e, request, waits = string.match(text, '^(%d+)|([^|]*)|(.*)$')
  return tonumber(e), request, waits
end

local function waits_encode(e, request, waits)
  return int(e) .. '|' .. request .. '|' .. waits
end

-- `n` random edges of the registry removed when their liveness is over (a
-- replica that crashed, or stopped renewing them).
local function waits_sweep(registry, n, now)
  for _, holder in ipairs(redis.call('HRANDFIELD', registry, n)) do
    if holder ~= WAITS_BYTES then
      local e = waits_edge(redis.call('HGET', registry, holder))
      if e <= now then
        waits_put(registry, holder, nil)
      end
    end
  end
end

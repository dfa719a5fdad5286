-- flags: no-writes (reads only: Redis runs it even while it refuses writes)
-- blockers: a bounded look at a lock's live grants for a deadlock check
-- (decision 0081): at most `most` grants other than the asking holder's,
-- found within at most `scan` of the lock's fields, so a lock of thousands
-- of holders costs the check what a small one does.
-- KEYS: the lock's (lock, queue, fence[, live locks])
-- ARGV: the holder asking, the most grants to return, the most fields to scan
-- Returns {now, limit, 0, {{holder, grant}, ...}, mode}: inspect's shape,
--   the waiters not counted
local holder, most, scan = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = clock_ms()
local L = load(lock_at(KEYS))
local mine = 'h:' .. holder

-- 1. Live grants of others, HSCAN step by step, until enough are found or
-- the fields scanned reach the bound (a compact hash comes whole at once).
local holders, cursor, scanned = {}, '0', 0
if L.holders > 0 then
  repeat
    local step = redis.call('HSCAN', L.key, cursor, 'COUNT', 64)
    cursor = step[1]
    local fields = step[2]
    for i = 1, #fields, 2 do
      local field = fields[i]
      if #holders < most and string.sub(field, 1, 2) == 'h:' and field ~= mine then
        local grant = parse_grant(string.sub(field, 3), fields[i + 1])
        if grant.expires > now then
          holders[#holders + 1] = {grant.holder, grant.text}
        end
      end
    end
    scanned = scanned + #fields / 2
  until cursor == '0' or #holders >= most or scanned >= scan
end

-- 2. The lock's rule, as inspect tells it.
local mode = L.mode or ''
if mode == 'w' and #holders == 0 then
  mode = 'r'
end
return {now, #holders > 0 and L.limit or 0, 0, holders, mode}

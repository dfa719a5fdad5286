-- list: the next locks of one shard in name order, with their live state.
-- KEYS: 1 index, 2 names, 3 fence (a shard script)
-- ARGV: 3 shard key prefix, 4 start after this name ('' = from the start),
--       5 name prefix ('' = every name), 6 most names to visit,
--       7 only locks with waiters ('1' | '0')
-- Returns {now, last name visited ('' = the shard is done),
--          {{name, holders, limit, waiters, next lease expiry}, ...}}
local shard, after, prefix = ARGV[3], ARGV[4], ARGV[5]
local most, only_waiting = tonumber(ARGV[6]), ARGV[7] == '1'
local now = redis_now()

-- 1. The next names after the cursor, within the prefix (byte order).
local from = prefix == '' and '-' or ('[' .. prefix)
if after ~= '' and after >= prefix then
  from = '(' .. after
end
local to = prefix == '' and '+' or ('[' .. prefix .. '\255')
local names = redis.call('ZRANGE', NAMES, from, to, 'BYLEX', 'LIMIT', '0', ARGV[6])

-- 2. Each lock's live state. Reads only: a lock with nothing live left is
--    skipped here and removed by the next write or the reaper.
local locks = {}
for _, name in ipairs(names) do
  use_lock(shard, name)
  load_lock()
  local holders, first = 0, nil
  for _, grant in ipairs(all_grants()) do
    if grant[2] > now then
      holders = holders + 1
      first = math.min(first or grant[2], grant[2])
    end
  end
  local waiters = redis.call('ZCOUNT', DEADLINES, '(' .. int(now), '+inf')
  if (holders > 0 and not only_waiting) or waiters > 0 then
    table.insert(locks, {name, holders, holders > 0 and L.limit or 0, waiters, first or 0})
  end
end

-- 3. Where the next call goes on: the last name visited, unless the shard ran out.
local last = ''
if #names == most then
  last = names[#names]
end
return {now, last, locks}

-- batch: group commit. Runs several operations of this library in one
-- call, in order, each exactly as its own function would run it and with
-- its own reply; the engine sends one when more than one operation for
-- the same shard (cluster slot) is ready (crates/tumbler-engine/src/group.rs).
-- KEYS: every operation's keys, one after the other (all of one slot on a
--       cluster, so Redis Cluster routes and checks the call as one)
-- ARGV: per operation: its name, its key count, its argument count, then
--       its arguments
-- Returns one reply per operation, in order: what its function returns,
--   or, when it failed (that operation only: each function checks its
--   input before it writes), its error as a string ('ERR …', the error
--   reply its own call would have had). No batched function replies a
--   bare string, so a string is an error; an error reply nested in the
--   array would make a client fail the whole call.
-- The batch reads TIME once (shared/numbers.lua `clock`; an answer-by time close
-- to it is judged on a fresh TIME: `late`) and writes each shard's fencing
-- counter once, with the highest token (`next_token`, `batch_end`).
-- OPS is the table of the library's operations (scripts.rs makes it).
local replies, n = {}, 0

-- Every operation in turn, each under pcall.
local function run_all()
  local k, a = 1, 1
  while a <= #ARGV do
    local name, key_count, arg_count = ARGV[a], num(ARGV[a + 1]), num(ARGV[a + 2])
    local keys = {unpack(KEYS, k, k + key_count - 1)}
    local args = {unpack(ARGV, a + 3, a + 2 + arg_count)}
    k, a, n = k + key_count, a + 3 + arg_count, n + 1
    local op = name ~= 'batch' and OPS[name]
    local ok, reply = false, 'ERR batch: no operation ' .. name
    if op then
      ok, reply = pcall(op, keys, args)
    end
    if type(reply) == 'table' and reply.err then
      ok, reply = false, reply.err
    end
    if ok then
      replies[n] = reply or false
    else
      replies[n] = string.gsub(tostring(reply), '[\r\n]', ' ')
    end
  end
end

-- The batch's state is cleared (and the fencing counters written) even
-- when its arguments are malformed: nothing of it may reach a later call.
batch_begin()
local ok, err = pcall(run_all)
batch_end()
if not ok then
  return redis.error_reply('ERR batch: ' .. tostring(type(err) == 'table' and err.err or err))
end
return replies

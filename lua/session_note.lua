-- session_note: add grants to a session's record (a value: the token, and
-- '|<set>' for a lock of a multi-lock set) or take them off (empty value),
-- for the stream that serves the session; a set's locks in one call.
-- KEYS[1] the session's record
-- ARGV: epoch, then pairs of grant field ('g:<namespace>\n<name>') and
--       value ('' = taken off)
-- Returns 1, or 0 when another stream resumed the session (nothing changed).
local epoch = ARGV[1]
if redis.call('HGET', KEYS[1], 'epoch') ~= epoch then
  return 0
end
for i = 2, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', KEYS[1], ARGV[i])
  else
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
return 1

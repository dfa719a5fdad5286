-- session_note: add a grant to a session's record (token) or take it off
-- (empty token), for the stream that serves the session.
-- KEYS[1] the session's record
-- ARGV: epoch, grant field ('g:<namespace>\n<name>'), token ('' = taken off)
-- Returns 1, or 0 when another stream resumed the session (nothing changed).
local epoch, field, token = unpack(ARGV, 1, 3)
if redis.call('HGET', KEYS[1], 'epoch') ~= epoch then
  return 0
end
if token == '' then
  redis.call('HDEL', KEYS[1], field)
else
  redis.call('HSET', KEYS[1], field, token)
end
return 1

-- session_open: record a new session, so that any replica can resume it
-- (the grants themselves live in their locks; this names them).
-- KEYS[1] the session's record (HASH; see keys.rs)
-- ARGV: owner (the token's name; '' with auth off), secret digest (hex
--       SHA-256 of the resume secret), ttl_ms, keep_ms (record expiry)
-- Returns the session's epoch: 1.
local owner, digest, ttl, keep = unpack(ARGV, 1, 4)
-- 'seen': when the serving stream last said it lives (Redis ms); a resume
-- past seen + ttl finds the session over (session_claim).
redis.call('HSET', KEYS[1], 'owner', owner, 'digest', digest, 'ttl', ttl, 'epoch', 1,
  'seen', int(clock_ms()))
redis.call('PEXPIRE', KEYS[1], keep)
return 1

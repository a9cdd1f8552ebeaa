-- live: refresh one process's liveness record (see K_PROCS in _lib.lua), and remove the
-- records that have expired: one call per process per interval, however many names it uses.
--
-- KEYS[1] the liveness records of the key prefix (ZSET: ident -> expiry, server ms)
-- ARGV[1] ident     the process's liveness ident
-- ARGV[2] ttl_ms    its record lives this long from now (never shortened)
--
-- Returns {expiry ms, records removed}.
local K_LIVE = KEYS[1]
local t_ms = F.now_ms()
local removed = redis.call('ZREMRANGEBYSCORE', K_LIVE, '-inf', t_ms)
local until_ms = t_ms + tonumber(ARGV[2])
local score = tonumber(redis.call('ZSCORE', K_LIVE, ARGV[1]))
if not score or score < until_ms then redis.call('ZADD', K_LIVE, until_ms, ARGV[1]) end
return {until_ms, removed}

-- refresh: extend a holder's lease, or keep a waiter's place alive.
--
-- KEYS[1..7]: see _lib.lua.
-- ARGV[1] token
-- ARGV[2] lease_ms      new lease length, from now, for a holder
-- ARGV[3] place_ttl_ms  new place lifetime, from now, for a waiter
--
-- Returns {status, expiry ms}: status 1 holder extended, 2 waiter's place extended,
-- 0 neither (the permit or place was lost).
local err = check_types()
if err then return err end

local token = ARGV[1]
local now = now_ms()
reclaim(now)
if redis.call('ZSCORE', K_HOLDERS, token) then
  local expiry = now + tonumber(ARGV[2])
  redis.call('ZADD', K_HOLDERS, 'XX', expiry, token)
  return {1, expiry}
end
if redis.call('ZSCORE', K_WEXP, token) then
  local expiry = now + tonumber(ARGV[3])
  redis.call('ZADD', K_WEXP, 'XX', expiry, token)
  return {2, expiry}
end
return {0, 0}

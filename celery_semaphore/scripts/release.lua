-- release: give back the units held by `token`, leave a tombstone, and name the waiters the
-- freed units now belong to.  Idempotent: a re-sent call finds the tombstone and reports the
-- release it already made.
--
-- KEYS[1..7]: see _lib.lua.
-- ARGV[1] token
-- ARGV[2] limit          the caller's limit (a runtime limit_override in meta wins)
-- ARGV[3] tombstone_ms   how long the token is remembered as released
-- ARGV[4] wake_grace_ms  see acquire.lua
-- ARGV[5] claim          '' releases whoever holds `token`; otherwise only a holder that was
--                        granted under this claim (another copy's permit is left alone)
--
-- Returns {status, wake pairs...}: status 1 released now, 2 released already (tombstone),
-- 0 not held (lost to lease expiry or never granted), 3 held under another claim.
local err = check_types()
if err then return err end

local token, client_limit = ARGV[1], tonumber(ARGV[2])
local tomb_ms, grace = tonumber(ARGV[3]), tonumber(ARGV[4])
local now = now_ms()
reclaim(now)

local status = 0
local raw = redis.call('HGET', K_HINFO, token)
local info = raw and cjson.decode(raw)
if info and ARGV[5] ~= '' and info['c'] ~= ARGV[5] then
  status = 3
elseif info then
  add_used(-info['w'])
  redis.call('ZREM', K_HOLDERS, token)
  redis.call('HDEL', K_HINFO, token)
  redis.call('ZADD', K_DONE, now + tomb_ms, token)
  status = 1
elseif redis.call('ZSCORE', K_DONE, token) then
  status = 2
end

local list = entitled(effective_limit(client_limit), meta_int('used'))
return collect_wakes(list, '', now, grace, {status})

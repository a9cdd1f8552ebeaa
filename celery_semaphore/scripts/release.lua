-- release: give back the units held by `token`, leave a tombstone, and name the waiters the
-- freed units now belong to.  Idempotent: a re-sent call finds the tombstone and reports the
-- release it already made.
--
-- KEYS[1..3]: see _lib.lua.
-- ARGV[1] token
-- ARGV[2] numbers        five integers, space-separated (one argument: fewer to send):
--           limit          the caller's limit (a runtime limit_override in state wins)
--           tombstone_ms   how long the token is remembered as released (0: not at all)
--           wake_grace_ms  see acquire.lua
--           aging_ms       see acquire.lua
--           timed          1: the hold counts in the hold-time average; 0: it ends no finished
--                          work (a forced release, a grant given back unused)
-- ARGV[3] claim          '' releases whoever holds `token`; otherwise only a holder that was
--                        granted under this claim (another copy's permit is left alone)
--
-- Returns {status, wake pairs...}: status 1 released now, 2 released already (tombstone),
-- 0 not held (lost to lease expiry or never granted), 3 held under another claim.  A timed
-- release now (1) updates the moving average of hold times (see release_holder()).
local token, claim = ARGV[1], ARGV[3]
local client_limit, tomb_ms, grace, aging, timed =
  string.match(ARGV[2], '^(%S+) (%S+) (%S+) (%S+) ([01])$')
client_limit, tomb_ms, grace = tonumber(client_limit), tonumber(tomb_ms), tonumber(grace)
aging = tonumber(aging)
if not (client_limit and tomb_ms and grace and aging) then
  return redis.error_reply('ERR release: ARGV[2] is not five numbers: ' .. ARGV[2])
end
local held, hold_avg = begin('h:' .. token, 'hold_avg')

local status = release_holder(token, held or false, claim, tomb_ms, hold_avg or false,
  timed == '1')

if waiting == 0 then return {status} end  -- nobody in line: nobody to wake
return collect_wakes(entitled(effective_limit(client_limit), aging), '', grace, {status})

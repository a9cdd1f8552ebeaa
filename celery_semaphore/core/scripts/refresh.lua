-- refresh: extend a holder's lease, or keep a waiter's place alive.
--
-- KEYS[1..4]: see _lib.lua.
-- ARGV[1] token
-- ARGV[2] lease_ms      new lease length, from now, for a holder
-- ARGV[3] place_ttl_ms  new place lifetime, from now, for a waiter
-- ARGV[4] limit         the caller's limit (a runtime limit_override in state wins)
-- ARGV[5] wake_grace_ms see acquire.lua
-- ARGV[6] aging_ms      see acquire.lua
-- ARGV[7] claim         '' extends whoever holds `token`; otherwise only a holder granted
--                       under this claim (a stalled copy never extends another delivery's
--                       lease: it is told 3 and learns that its permit is gone)
--
-- Returns {status, expiry ms, wake pairs...}: status 1 holder extended, 2 waiter's place
-- extended, 3 held under another claim (nothing extended), 0 neither (the permit or place
-- was lost).  The wake pairs name the waiters that
-- units freed by the reclaim (expired leases, places) now belong to.
local token, claim = ARGV[1], ARGV[7] or ''
local holder, waiter = F.begin('h:' .. token, 'w:' .. token)
local reply = {0, 0}
local held_claim = false
if holder then
  local _, _, c = F.parse_holder(holder)
  held_claim = c
end
if holder and claim ~= '' and held_claim ~= claim then
  reply = {3, 0}
elseif holder then
  local expiry = now + tonumber(ARGV[2])
  redis.call('ZADD', K_EXP, 'XX', expiry, 'h:' .. token)
  reply = {1, expiry}
elseif waiter then
  local expiry = now + tonumber(ARGV[3])
  redis.call('ZADD', K_EXP, 'XX', expiry, 'w:' .. token)
  reply = {2, expiry}
end
local list = F.entitled(F.effective_limit(tonumber(ARGV[4])), tonumber(ARGV[6]))
-- '' for me: a waiter that only refreshes its place is not granted, so it is named too
return F.collect_wakes(list, '', tonumber(ARGV[5]), reply)

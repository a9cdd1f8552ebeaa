-- withdraw: leave the line (a waiter that gives up), and name the waiters that the units it
-- had reserved now belong to.
--
-- KEYS[1..4]: see _lib.lua.
-- ARGV[1] ticket
-- ARGV[2] limit          the caller's limit (a runtime limit_override in state wins)
-- ARGV[3] wake_grace_ms  see acquire.lua
-- ARGV[4] aging_ms       see acquire.lua
-- ARGV[5] wake_self      '1': also name the withdrawn waiter itself (first), so it learns at
--                        once that its place is gone (an operator's reset) and asks again
-- ARGV[6] claim          '' withdraws whoever's place it is; otherwise only a place last
--                        asked under this claim (or under none): another delivery's is left
--
-- Returns {status, wake pairs...}: status 1 the place was removed, 0 there was none, 3 it is
-- another claim's (left in line).
local ticket, claim = ARGV[1], ARGV[6]
local raw = F.begin('w:' .. ticket)
local status = 0
local reply = {status}
local info = raw and F.parse_waiter(raw)
if info and F.foreign_place(info, claim) then
  reply[1] = 3
elseif info then
  F.drop_waiter(ticket, info)
  reply[1] = 1
  if ARGV[5] == '1' and (CAN_DISPATCH or info.d == '') then
    reply[2] = ticket
    reply[3] = info.d
  end
end
local list = F.entitled(F.effective_limit(tonumber(ARGV[2])), tonumber(ARGV[4]))
return F.collect_wakes(list, ticket, tonumber(ARGV[3]), reply)

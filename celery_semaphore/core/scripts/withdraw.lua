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
--
-- Returns {status, wake pairs...}: status 1 the place was removed, 0 there was none.
local ticket = ARGV[1]
local raw = F.begin('w:' .. ticket)
local status = 0
local reply = {status}
if raw then
  local info = F.parse_waiter(raw)
  F.drop_waiter(ticket, info)
  reply[1] = 1
  if ARGV[5] == '1' and (CAN_DISPATCH or info.d == '') then
    reply[2] = ticket
    reply[3] = F.wake_data(info)
  end
end
local list = F.entitled(F.effective_limit(tonumber(ARGV[2])), tonumber(ARGV[4]))
return F.collect_wakes(list, ticket, tonumber(ARGV[3]), reply)

-- withdraw: leave the line (a waiter that gives up), and name the waiters that the units it
-- had reserved now belong to.
--
-- KEYS[1..3]: see _lib.lua.
-- ARGV[1] ticket
-- ARGV[2] limit          the caller's limit (a runtime limit_override in state wins)
-- ARGV[3] wake_grace_ms  see acquire.lua
-- ARGV[4] aging_ms       see acquire.lua
--
-- Returns {status, wake pairs...}: status 1 the place was removed, 0 there was none.
local ticket = ARGV[1]
local raw = begin('w:' .. ticket)
local status = 0
if raw then
  drop_waiter(ticket, parse_waiter(raw))
  status = 1
end
local list = entitled(effective_limit(tonumber(ARGV[2])), tonumber(ARGV[4]))
return collect_wakes(list, '', tonumber(ARGV[3]), {status})

-- reclaim: take back expired leases and places now, and name the waiters that should wake.
-- Run by heartbeats and inspection so an idle semaphore recovers without new traffic.
--
-- KEYS[1..4]: see _lib.lua.
-- ARGV[1] limit          the caller's limit (a runtime limit_override in state wins)
-- ARGV[2] wake_grace_ms  see acquire.lua
-- ARGV[3] aging_ms       see acquire.lua
--
-- Returns {holders reclaimed, wake pairs...}.
F.begin()
local list = F.entitled(F.effective_limit(tonumber(ARGV[1])), tonumber(ARGV[3]))
return F.collect_wakes(list, '', tonumber(ARGV[2]), {reclaimed})

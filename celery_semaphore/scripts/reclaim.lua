-- reclaim: take back expired leases and places now, and name the waiters that should wake.
-- Run by heartbeats and inspection so an idle semaphore recovers without new traffic.
--
-- KEYS[1..7]: see _lib.lua.
-- ARGV[1] limit          the caller's limit (a runtime limit_override in meta wins)
-- ARGV[2] wake_grace_ms  see acquire.lua
--
-- Returns {holders reclaimed, wake pairs...}.
local err = check_types()
if err then return err end

local now = now_ms()
local n = reclaim(now)
local list = entitled(effective_limit(tonumber(ARGV[1])), meta_int('used'))
return collect_wakes(list, '', now, tonumber(ARGV[2]), {n})

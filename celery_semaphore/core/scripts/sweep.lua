-- sweep: what a process's heartbeat does about once a second for each semaphore it uses, in
-- one call: read the state's boot marker (writing ARGV[4] when the state has none; see
-- Semaphore.boot_marker), take back expired leases and places now, and name the waiters that
-- should wake (as reclaim.lua).
--
-- KEYS[1..4]: see _lib.lua.
-- ARGV[1] limit          the caller's limit (a runtime limit_override in state wins)
-- ARGV[2] wake_grace_ms  see acquire.lua
-- ARGV[3] aging_ms       see acquire.lua
-- ARGV[4] fresh          the marker written when the state has none
--
-- Returns {holders reclaimed, of them those whose process's liveness record had expired (see
-- K_PROCS), marker, fence, wake pairs...}.
local boot, fence = F.begin('boot', 'fence')
if not boot then
  boot = ARGV[4]
  redis.call('HSET', K_STATE, 'boot', boot)
end
local list = F.entitled(F.effective_limit(tonumber(ARGV[1])), tonumber(ARGV[3]))
return F.collect_wakes(list, '', tonumber(ARGV[2]), {reclaimed, died, boot, fence or '0'})

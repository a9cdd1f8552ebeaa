-- throttle: the downstream service refused a call (429, 503): pause new grants, and with an
-- adaptive caller lower the limit (once per congestion episode).  See "Adaptive limits" in
-- _lib.lua and docs/concepts.md.
--
-- KEYS[1..4]: see _lib.lua.
-- ARGV[1] numbers   six integers, space-separated:
--           limit         the caller's limit (a runtime limit_override in state wins)
--           retry_ms      nobody starts for this long from now (0: no pause); a longer pause
--                         already set is kept
--           adaptive      1: halve the limit now in force (floor, at least 1), unless this
--                         throttle belongs to the episode of the last decrease; 0: pause and
--                         count only
--           fence         the fencing token of the permit whose call was refused (0: none).
--                         With one, the episode rule is exact: a permit granted before the
--                         last decrease (fence <= dec_fence) ran under the old limit, so its
--                         refusal lowers nothing more.  Without one, a throttle within
--                         dec_until of the last decrease (max(its pause, 1 s, the hold-time
--                         average) after it) lowers nothing more.
--           wake_grace_ms see acquire.lua
--           aging_ms      see acquire.lua
--
-- Returns {decreased (1: this call lowered the limit), units that may be held now (the lowered
-- limit or the limit in force), ms until the pause ends (0: none), throttles so far,
-- wake pairs...}.
local client_limit, retry_ms, adaptive, fence, grace, aging =
  string.match(ARGV[1], '^(%d+) (%d+) ([01]) (%d+) (%d+) (%d+)$')
if not client_limit then
  return redis.error_reply('ERR throttle: ARGV[1] is not six numbers: ' .. ARGV[1])
end
client_limit, retry_ms, fence = tonumber(client_limit), tonumber(retry_ms), tonumber(fence)
grace, aging = tonumber(grace), tonumber(aging)
local hold_avg, grants, counts = F.begin('hold_avg', 'fence', 'throttles')
local limit = F.effective_limit(client_limit)

local total = (tonumber(string.match(counts or '', '^(%d+)')) or 0) + 1
redis.call('HSET', K_STATE, 'throttles', total .. ' ' .. now_text)

local a = aimd or {cwnd = 0, acc = 0, fence = 0, till = 0, pause = 0}
local decreased = 0
if adaptive == '1' then
  local fresh
  if fence > 0 then fresh = fence > a.fence else fresh = now >= a.till end
  if fresh then
    local cwnd = math.max(1, math.floor(F.adaptive_cap(limit) / 2))
    if cwnd >= limit then cwnd = 0 end  -- a limit of 1 cannot go lower
    a.cwnd, a.acc = cwnd, 0
    a.fence = tonumber(grants) or 0
    a.till = now + math.max(retry_ms, 1000, tonumber(hold_avg) or 0)
    decreased = 1
  end
end
if retry_ms > 0 then a.pause = math.max(a.pause, now + retry_ms) end
aimd = a
F.store_aimd()

local reply = {decreased, F.adaptive_cap(limit), F.pause_left(), total}
return F.collect_wakes(F.entitled(limit, aging), '', grace, reply)

-- group_release: release the permit `token` holds in every member semaphore of a group, and
-- name the waiters the freed units now belong to, in every member.
--
-- KEYS: four per member (see group_acquire.lua).
-- ARGV[1] token
-- ARGV[2] numbers   four integers: tombstone_ms wake_grace_ms aging_ms timed (as in release.lua)
-- ARGV[3] claim     as in release.lua
-- ARGV[4] limits    each member's limit (the caller's; a runtime override wins), in order
--
-- Returns {member count m, m statuses (as release.lua's), wake triples (member index, ticket,
-- data)...}.  Each member released now (timed) updates its own moving average of hold times
-- (and its adaptive limit, when one is lowered: see release_holder()).
local token, claim = ARGV[1], ARGV[3]
local tomb_ms, grace, aging, timed = string.match(ARGV[2], '^(%S+) (%S+) (%S+) ([01])$')
tomb_ms, grace, aging = tonumber(tomb_ms), tonumber(grace), tonumber(aging)
if not (tomb_ms and grace and aging) then
  return redis.error_reply('ERR group_release: ARGV[2] is not four numbers: ' .. ARGV[2])
end
timed = timed == '1'
local m = #KEYS / 4
local limits = {}
for value in string.gmatch(ARGV[4], '%S+') do limits[#limits + 1] = tonumber(value) end

local held, avgs = {}, {}
for i = 1, m do
  F.use(i)
  local holder, hold_avg = F.begin('h:' .. token, 'hold_avg')
  held[i], avgs[i] = holder or false, hold_avg or false
end
local out, wakes = {m}, {}
for i = 1, m do
  F.use(i)
  out[#out + 1] = F.release_holder(token, held[i], claim, tomb_ms, avgs[i], timed,
    F.effective_limit(limits[i]))
  if waiting > 0 then
    local found = F.collect_wakes(F.entitled(F.effective_limit(limits[i]), aging), '', grace, {})
    for j = 1, #found, 2 do
      wakes[#wakes + 1] = i
      wakes[#wakes + 1] = found[j]
      wakes[#wakes + 1] = found[j + 1]
    end
  end
end
for _, v in ipairs(wakes) do out[#out + 1] = v end
return out

-- group_refresh: extend the lease of `token` in every member semaphore of a group (or the
-- life of its places), or withdraw its places; and name the waiters to wake.
--
-- KEYS: four per member (see group_acquire.lua).
-- ARGV[1] token
-- ARGV[2] numbers   five values: mode ('r' refresh, 'w' withdraw) lease_ms place_ttl_ms
--                   wake_grace_ms aging_ms
-- ARGV[3] limits    each member's limit (the caller's; a runtime override wins), in order
-- ARGV[4] claim     refresh: '' extends whoever holds `token`; otherwise only a grant made
--                   under this claim in every member (another delivery's is left alone)
--
-- Returns {status, expiry ms, wake triples (member index, ticket, data)...}.
--   refresh:  status 1 holder in every member, extended; 2 waiter in every member, extended;
--             3 held under another claim in some member (nothing is extended); 0 otherwise (nothing is extended: the group permit or place is lost).
--   withdraw: status 1 when it had a place in some member (all are removed), else 0.
local token, claim = ARGV[1], ARGV[4] or ''
local mode, lease_ms, place_ms, grace, aging =
  string.match(ARGV[2], '^(%S+) (%S+) (%S+) (%S+) (%S+)$')
lease_ms, place_ms, grace, aging = tonumber(lease_ms), tonumber(place_ms), tonumber(grace),
  tonumber(aging)
if not (lease_ms and place_ms and grace and aging) then
  return redis.error_reply('ERR group_refresh: ARGV[2] is not five values: ' .. ARGV[2])
end
local m = #KEYS / 4
local limits = {}
for value in string.gmatch(ARGV[3], '%S+') do limits[#limits + 1] = tonumber(value) end

local holders, waiters, n_held, n_waiting, foreign = {}, {}, 0, 0, false
for i = 1, m do
  F.use(i)
  local holder, waiter = F.begin('h:' .. token, 'w:' .. token)
  holders[i], waiters[i] = holder or false, waiter or false
  if holder and claim ~= '' then
    local _, _, held_claim = F.parse_holder(holder)
    if held_claim ~= claim then foreign = true end
  end
  if holder then n_held = n_held + 1 end
  if waiter then n_waiting = n_waiting + 1 end
end

local status, expiry = 0, 0
if mode == 'w' then
  for i = 1, m do
    if waiters[i] then
      F.use(i)
      F.drop_waiter(token, F.parse_waiter(waiters[i]))
      status = 1
    end
  end
elseif foreign then
  status = 3
elseif n_held == m then
  expiry = now + lease_ms
  for i = 1, m do
    F.use(i)
    redis.call('ZADD', K_EXP, 'XX', expiry, 'h:' .. token)
  end
  status = 1
elseif n_waiting == m then
  expiry = now + place_ms
  for i = 1, m do
    F.use(i)
    redis.call('ZADD', K_EXP, 'XX', expiry, 'w:' .. token)
  end
  status = 2
end

local out = {status, expiry}
for i = 1, m do
  F.use(i)
  local found = F.collect_wakes(F.entitled(F.effective_limit(limits[i]), aging), '', grace, {})
  for j = 1, #found, 2 do
    out[#out + 1] = i
    out[#out + 1] = found[j]
    out[#out + 1] = found[j + 1]
  end
end
return out

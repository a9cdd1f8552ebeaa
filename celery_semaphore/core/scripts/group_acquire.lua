-- group_acquire: grant `ticket` a permit in every member semaphore of a group, or in none.
-- While not granted it keeps a place in every member's line (added in this one script, so
-- two waiters of one partition stand in the same order in every line they share).  It is
-- granted when the free units of every member are its (see entitled() in _lib.lua).
--
-- KEYS: four per member (see _lib.lua), member i at KEYS[4i-3 .. 4i], in the group's order.
-- A member with a rate stored (by a Semaphore with rate=) counts this grant as a start, and
-- grants only when the rate has room (entitled() checks it); this script stores no rate.
-- ARGV[1]  ticket
-- ARGV[2]  numbers    seven integers: lease_ms place_ttl_ms wake_grace_ms epoch check_done
--                     (check_done as in acquire.lua: 1 reports a tombstone as done and drops
--                     the places, 2 forgets an old tombstone, 0 neither)
--                     part_weight aging_ms (as in acquire.lua)
-- ARGV[3]  claim, ARGV[4] owner, ARGV[5] wake data, ARGV[6] partition (as in acquire.lua)
-- ARGV[7]  per member, three integers each: weight limit cap (cap -1: none)
--
-- Returns {status, n1, n2, now, n4, member count m, m values, wake triples...}:
--   status 1 granted         n2 lease expiry; values: each member's fencing token
--   status 2 already held    n2 lease expiry; values: fencing tokens
--   status 3 held by another claim, or held in only some members (values 0)
--   status 4 done: released before
--   status 5 waiting         n1 the largest position, n2 epoch; values: each position
--   status 6 weight over limit  n1 that member's effective limit, n4 its index (1-based)
--   status 7 not granted, no place kept
--   status 8 stale epoch     n1 epoch of the place
--   then member index, ticket, data for every other waiter to wake.
local ticket, claim, owner, data, part = ARGV[1], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local lease_ms, place_ttl, grace, epoch, check_done, part_weight, aging =
  string.match(ARGV[2], '^(%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+)$')
lease_ms, place_ttl, grace = tonumber(lease_ms), tonumber(place_ttl), tonumber(grace)
epoch, part_weight, aging = tonumber(epoch), tonumber(part_weight), tonumber(aging)
if not (lease_ms and place_ttl and grace and epoch and part_weight and aging) then
  return redis.error_reply('ERR group_acquire: ARGV[2] is not seven numbers: ' .. ARGV[2])
end
local forget = check_done == '2'
check_done = check_done == '1'
name_rate_heads = false  -- as in acquire.lua
local m = #KEYS / 4
local spec = {}
for value in string.gmatch(ARGV[7], '%S+') do spec[#spec + 1] = value end
if #spec ~= 3 * m then
  return redis.error_reply('ERR group_acquire: ARGV[7] is not three numbers per member')
end

local M = {}
for i = 1, m do
  F.use(i)
  local held, raw, fence, part_raw = F.begin('h:' .. ticket, 'w:' .. ticket, 'fence', 'p:' .. part)
  local limit = F.effective_limit(tonumber(spec[3 * i - 1]))
  M[i] = {held = held, raw = raw, fence = tonumber(fence) or 0, part_raw = part_raw,
          limit = limit, weight = tonumber(spec[3 * i - 2]), weight_text = spec[3 * i - 2],
          cap = tonumber(spec[3 * i])}
end

local function reply(status, n1, n2, n4, values)
  local out = {status, n1, n2, now, n4, m}
  for i = 1, m do out[#out + 1] = values and values[i] or 0 end
  return out
end

-- Name the waiters to wake in every member (lists: what entitled() gave, when known).
local function finish(out, lists)
  for i = 1, m do
    F.use(i)
    local list = lists and lists[i] or F.entitled(M[i].limit, aging)
    local found = F.collect_wakes(list, ticket, grace, {})
    for j = 1, #found, 2 do
      out[#out + 1] = i
      out[#out + 1] = found[j]
      out[#out + 1] = found[j + 1]
    end
  end
  return out
end

local n_held, n_mine, fences = 0, 0, {}
for i = 1, m do
  if M[i].held then
    local _, fence, held_claim = F.parse_holder(M[i].held)
    n_held = n_held + 1
    fences[i] = fence
    if held_claim == claim then n_mine = n_mine + 1 end
  end
end
if n_held > 0 then
  if n_mine < m then return finish(reply(3, 0, 0, 0)) end
  local expiry = now + lease_ms
  for i = 1, m do
    F.use(i)
    redis.call('ZADD', K_EXP, 'XX', expiry, 'h:' .. ticket)
  end
  return finish(reply(2, 0, expiry, 0, fences))
end
if check_done then
  local done = false
  for i = 1, m do
    F.use(i)
    if F.tombstone(ticket) then done = true end
  end
  if done then
    -- the execution is over: its places go too
    for i = 1, m do
      if M[i].raw then
        F.use(i)
        F.drop_waiter(ticket, F.parse_waiter(M[i].raw))
      end
    end
    return finish(reply(4, 0, 0, 0))
  end
elseif forget then
  for i = 1, m do
    F.use(i)
    F.forget_done(ticket)
  end
end
for i = 1, m do
  if M[i].weight > M[i].limit then return finish(reply(6, M[i].limit, 0, i)) end
end
for i = 1, m do
  if M[i].raw then
    M[i].info = F.parse_waiter(M[i].raw)
    if epoch < M[i].info.e then return finish(reply(8, M[i].info.e, 0, 0)) end
  end
end

-- a place in every line, then: is every member's share ours?
local lists, all_mine = {}, true
for i = 1, m do
  F.use(i)
  local x = M[i]
  x.record = F.partition_record(part, x.part_raw, x.cap, part_weight)
  F.store_record(part, x.part_raw, x.record)
  x.info = F.enqueue(ticket, x.info or false, x.weight, epoch, owner, data, grace, part)
end
for i = 1, m do
  F.use(i)
  lists[i] = F.entitled(M[i].limit, aging)
  local mine = false
  for _, entry in ipairs(lists[i]) do
    if entry[1] == ticket then mine = true break end
  end
  all_mine = all_mine and mine
end

if all_mine then
  local expiry = 0
  for i = 1, m do
    F.use(i)
    local x = M[i]
    local fence, until_ms = F.grant(ticket, x.weight, x.weight_text, claim, owner, lease_ms,
      x.fence, part, x.record)
    F.drop_waiter(ticket, x.info)
    fences[i] = fence
    expiry = math.max(expiry, until_ms)
  end
  return finish(reply(1, 0, expiry, 0, fences), lists)
end

if place_ttl > 0 then
  local positions, most = {}, 0
  for i = 1, m do
    F.use(i)
    redis.call('ZADD', K_EXP, now + place_ttl, 'w:' .. ticket)
    positions[i] = F.position(ticket, M[i].info)
    most = math.max(most, positions[i])
  end
  return finish(reply(5, most, epoch, 0, positions), lists)
end
for i = 1, m do
  F.use(i)
  F.drop_waiter(ticket, M[i].info)
end
return finish(reply(7, 0, 0, 0))

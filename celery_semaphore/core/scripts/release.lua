-- release: give back the units held by `token`, leave a tombstone, and name the waiters the
-- freed units now belong to.  Idempotent: a re-sent call finds the tombstone and reports the
-- release it already made.
--
-- KEYS[1..4]: see _lib.lua.
-- ARGV[1] token
-- ARGV[2] numbers        six integers, space-separated (one argument: fewer to send):
--           limit          the caller's limit (a runtime limit_override in state wins)
--           tombstone_ms   how long the token is remembered as released (0: not at all)
--           wake_grace_ms  see acquire.lua
--           aging_ms       see acquire.lua
--           timed          1: the hold counts in the hold-time average; 0: it ends no finished
--                          work (a forced release, a grant given back unused)
--           handoff_ms     lease for handoff grants (0: make none): an entitled parked
--                          waiter whose wake data ends with HANDOFF_MARK and whose owner (JSON)
--                          has a string "claim" is granted its units here, under that claim,
--                          instead of being named to come and claim them (one round trip less
--                          per handoff); its owner's "lease_ms", when a number from 1 ms to
--                          1e12 ms, is the grant's lease instead
-- ARGV[3] claim          '' releases whoever holds `token`; otherwise only a holder that was
--                        granted under this claim (another copy's permit is left alone)
--
-- Returns {status, wake pairs...}: status 1 released now, 2 released already (tombstone),
-- 0 not held (lost to lease expiry or never granted), 3 held under another claim.  A timed
-- release now (1) updates the moving average of hold times and counts as a success for an
-- adaptive limit (see release_holder()).  With
-- handoff_ms > 0 the reply is {status, n, n handoffs as ticket, wake data, fencing token, lease
-- expiry ms, claim, then the wake pairs}: the claim the grant was made under, which only the
-- waiter and this script know, lets the receiver tell a real handoff from a forged one.
local HANDOFF_MARK = '#handoff'  -- the Python side's HANDOFF_MARK
local token, claim = ARGV[1], ARGV[3]
local client_limit, tomb_ms, grace, aging, timed, handoff_ms =
  string.match(ARGV[2], '^(%S+) (%S+) (%S+) (%S+) ([01]) (%S+)$')
client_limit, tomb_ms, grace = tonumber(client_limit), tonumber(tomb_ms), tonumber(grace)
aging, handoff_ms = tonumber(aging), tonumber(handoff_ms)
if not (client_limit and tomb_ms and grace and aging and handoff_ms) then
  return redis.error_reply('ERR release: ARGV[2] is not six numbers: ' .. ARGV[2])
end
local held, hold_avg, fence = F.begin('h:' .. token, 'hold_avg', 'fence')

local status = F.release_holder(token, held or false, claim, tomb_ms, hold_avg or false,
  timed == '1', F.effective_limit(client_limit))

if handoff_ms <= 0 or not CAN_DISPATCH then
  if waiting == 0 then return {status} end  -- nobody in line: nobody to wake
  return F.collect_wakes(F.entitled(F.effective_limit(client_limit), aging), '', grace, {status})
end
if waiting == 0 then return {status, 0} end
local list = F.entitled(F.effective_limit(client_limit), aging)
-- Handoff: grant the entitled waiters that take it now (entitled() counted their units as
-- served already); name the others.
local reply, named = {status, 0}, {}
fence = tonumber(fence) or 0
-- the claim a handoff waiter's grant is made under, its owner's "claim" (false: none, not a
-- handoff waiter), and the grant's lease
local function handoff_terms(info)
  local data = info.d
  if #data <= #HANDOFF_MARK or string.sub(data, -#HANDOFF_MARK) ~= HANDOFF_MARK then
    return false
  end
  local ok, owner = pcall(cjson.decode, info.o)
  if not ok or type(owner) ~= 'table' then return false end
  local c = owner.claim
  if type(c) ~= 'string' or c == '' then return false end
  local lease = owner.lease_ms
  if type(lease) ~= 'number' or lease < 1 or lease > 1e12 then return c, handoff_ms end
  return c, math.floor(lease)
end

for _, entry in ipairs(list) do
  local ticket, info = entry[1], entry[2]
  local data = info.d
  local handoff_to, lease_ms = handoff_terms(info)
  if handoff_to then
    local record = nil
    if info.p ~= '' then
      local u, c, w = F.parse_part(redis.call('HGET', K_STATE, 'p:' .. info.p))
      record = {u, c or -1, w}
    end
    local expiry
    fence, expiry = F.grant(ticket, info.w, tostring(info.w), handoff_to, info.o, lease_ms, fence,
      info.p, record)
    F.drop_waiter(ticket, info)
    reply[#reply + 1] = ticket
    reply[#reply + 1] = data
    reply[#reply + 1] = fence
    reply[#reply + 1] = expiry
    reply[#reply + 1] = handoff_to
    reply[2] = reply[2] + 1
  else
    named[#named + 1] = entry
  end
end
return F.collect_wakes(named, '', grace, reply)

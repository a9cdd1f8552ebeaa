-- inspect: a read-only snapshot of one semaphore (expired entries are left out, not removed).
--
-- KEYS[1..4]: see _lib.lua; KEYS[5], optional: the liveness records of the key prefix
--   (K_PROCS in _lib.lua), declared by every caller that can read them (not on a Redis
--   Cluster), whether or not its own liveness is on: each holder's record is reported.
-- ARGV: none.
--
-- Returns {now ms, used, limit_override or '', holder count, waiter count, partition count,
--          grants so far (the fence counter),
--          average hold time of recent releases in ms ('' before the first release),
--          leases reclaimed after expiry so far,
--          holders: token, lease expiry ms, weight, fencing token, acquired ms, owner JSON,
--                   partition, its process's liveness ident ('': granted without one),
--                   that process's record expiry ms ('-': no record, the process is dead;
--                   '': no ident, or no K_PROCS to read) (repeated, by lease expiry),
--          waiters: ticket, place expiry ms, weight, since ms, wake data, owner JSON,
--                   partition, position in the partition, arrival number
--                   (repeated, by partition, FIFO within one),
--          partitions: name, used, waiters, cap (-1: none), weight
--                   (repeated, by name; those with live holders or waiters),
--          rate window count,
--          rate windows: count, period ms, weight started in the window, ms until it has
--                   room for one more start and, when spaced, its spacing lets one in (0:
--                   now), 1 when the window is spaced (else 0) (repeated, as stored: by
--                   period),
--          1 when those windows are a runtime rate override (else 0),
--          the adaptive limit (0: not lowered), ms until the throttle pause ends (0: none),
--          throttles so far, server ms of the last throttle (0: none),
--          newcomers refused because their line was full (max_waiting) so far, places
--          dropped to make room for newer waiters (keep_newest) so far,
--          holders reclaimed because their process's liveness record expired so far (of
--          the leases reclaimed above)}.
-- `used` counts only live holders.  Read-only, so it needs no care about the order of reads.
-- Cost: one pass over the state hash (live holders, waiters and partitions only; tombstones are
-- not there).
now, now_text = F.now_ms()
redis.call('ZCARD', K_EXP)  -- read every key, so foreign data there is reported here too
local state = redis.call('HGETALL', K_STATE)
local order = redis.call('ZRANGE', K_LINE, 0, -1)

local fields, holder_fields, override, fence, hold_avg, reclaimed_total = {}, {}, '', 0, '', 0
local records = {}
local rate_is_override, cwnd, pause, throttles, last_throttle = 0, 0, 0, 0, 0
local full_total, dropped_total, died_total, live_text = 0, 0, 0, false
for i = 1, #state, 2 do
  local field = state[i]
  local kind = string.sub(field, 1, 2)
  if kind == 'h:' or kind == 'w:' then
    fields[field] = state[i + 1]
  elseif kind == 'p:' then
    records[string.sub(field, 3)] = state[i + 1]
  elseif field == 'limit_override' then
    override = state[i + 1]
  elseif field == 'fence' then
    fence = tonumber(state[i + 1])
  elseif field == 'hold_avg' then
    hold_avg = state[i + 1]
  elseif field == 'reclaimed' then
    reclaimed_total = tonumber(state[i + 1]) or 0
  elseif field == 'rate' then
    rate = F.parse_rate(state[i + 1])
    if F.rate_overridden(state[i + 1]) then rate_is_override = 1 end
  elseif field == 'aimd' then
    local c, p = string.match(state[i + 1], '^(%d+) %d+ %d+ %d+ (%d+)$')
    cwnd, pause = tonumber(c) or 0, tonumber(p) or 0
  elseif field == 'full' then
    full_total = tonumber(state[i + 1]) or 0
  elseif field == 'dropped' then
    dropped_total = tonumber(state[i + 1]) or 0
  elseif field == 'died' then
    died_total = tonumber(state[i + 1]) or 0
  elseif field == 'live' then
    live_text = state[i + 1]
  elseif field == 'throttles' then
    local n, at = string.match(state[i + 1], '^(%d+) (%d+)$')
    throttles, last_throttle = tonumber(n) or 0, tonumber(at) or 0
  end
end

local function expiries(members)
  local out = {}
  for i, member in ipairs(members) do out[i] = redis.call('ZSCORE', K_EXP, member) end
  return out
end

-- partition name -> {used, waiters}
local parts = {}
local function part(name)
  local p = parts[name]
  if not p then
    p = {0, 0}
    parts[name] = p
  end
  return p
end

for field in pairs(fields) do
  if string.sub(field, 1, 2) == 'h:' then holder_fields[#holder_fields + 1] = field end
end
local holder_exp = expiries(holder_fields)
local live = {}
for i, field in ipairs(holder_fields) do
  local expiry = holder_exp[i]
  if expiry and tonumber(expiry) > now then live[#live + 1] = {field, expiry} end
end
table.sort(live, function(a, b)
  local x, y = tonumber(a[2]), tonumber(b[2])
  if x ~= y then return x < y end
  return a[1] < b[1]
end)

-- Each holder's process: the state's 'live' field (holders by liveness ident, see _lib.lua);
-- unreadable text (foreign data) reads as no idents.  Its record: one ZSCORE per process.
local ident_of, record_of = {}, {}
if live_text then
  local ok, by_ident = pcall(cjson.decode, live_text)
  if ok and type(by_ident) == 'table' then
    for ident, tokens in pairs(by_ident) do
      if type(ident) == 'string' and type(tokens) == 'table' then
        for _, token in ipairs(tokens) do ident_of[token] = ident end
      end
    end
  end
end
local function record(ident)
  if not ident or not K_PROCS then return '' end
  local score = record_of[ident]
  if not score then
    score = redis.call('ZSCORE', K_PROCS, ident) or '-'
    record_of[ident] = score
  end
  return score
end

local holders = {}
local live_used = 0
for _, entry in ipairs(live) do
  local raw = fields[entry[1]]
  local w, f, at, n, np, p = string.match(raw, '^(%d+) (%S+) (%S+) [01] (%d+) (%d+) ()')
  local stop = p + tonumber(n)
  local pstop = stop + tonumber(np)
  local name = string.sub(raw, stop, pstop - 1)
  live_used = live_used + tonumber(w)
  local pp = part(name)
  pp[1] = pp[1] + tonumber(w)
  holders[#holders + 1] = string.sub(entry[1], 3)
  holders[#holders + 1] = entry[2]
  holders[#holders + 1] = tonumber(w)
  holders[#holders + 1] = f
  holders[#holders + 1] = at
  holders[#holders + 1] = string.sub(raw, pstop)
  holders[#holders + 1] = name
  local ident = ident_of[string.sub(entry[1], 3)]
  holders[#holders + 1] = ident or ''
  holders[#holders + 1] = record(ident)
end

local waiter_fields, tickets = {}, {}
for i, member in ipairs(order) do
  local _, _, ticket = F.split_member(member)
  tickets[i] = ticket
  waiter_fields[i] = 'w:' .. ticket
end
local waiter_exp = expiries(waiter_fields)
local waiters = {}
for i, ticket in ipairs(tickets) do
  local expiry, raw = waiter_exp[i], fields[waiter_fields[i]]
  if expiry and raw and tonumber(expiry) > now then
    local info = F.parse_waiter(raw)
    local pp = part(info.p)
    waiters[#waiters + 1] = ticket
    waiters[#waiters + 1] = expiry
    waiters[#waiters + 1] = info.w
    waiters[#waiters + 1] = info.since
    waiters[#waiters + 1] = info.d
    waiters[#waiters + 1] = info.o
    waiters[#waiters + 1] = info.p
    waiters[#waiters + 1] = pp[2]
    waiters[#waiters + 1] = info.seq
    pp[2] = pp[2] + 1
  end
end

local names = {}
for name in pairs(parts) do names[#names + 1] = name end
table.sort(names)
local partitions = {}
for _, name in ipairs(names) do
  local _, cap, weight = F.parse_part(records[name])
  local pp = parts[name]
  partitions[#partitions + 1] = name
  partitions[#partitions + 1] = pp[1]
  partitions[#partitions + 1] = pp[2]
  partitions[#partitions + 1] = cap or -1
  partitions[#partitions + 1] = weight
end

local reply = {now, live_used, override, #holders / 9, #waiters / 9, #partitions / 5, fence,
               hold_avg, reclaimed_total}
for _, v in ipairs(holders) do reply[#reply + 1] = v end
for _, v in ipairs(waiters) do reply[#reply + 1] = v end
for _, v in ipairs(partitions) do reply[#reply + 1] = v end
if rate then
  F.read_last_start()
  reply[#reply + 1] = #rate.windows
  for _, win in ipairs(rate.windows) do
    local one = {windows = {win}, max_p = win[2], min_n = win[1],
                 space = win[3] and win[2] / win[1]}
    local all = rate
    rate = one
    reply[#reply + 1] = win[1]
    reply[#reply + 1] = win[2]
    reply[#reply + 1] = F.rate_used(win[2])
    reply[#reply + 1] = F.rate_wait(1)
    reply[#reply + 1] = win[3] and 1 or 0
    rate = all
  end
else
  reply[#reply + 1] = 0
end
reply[#reply + 1] = rate_is_override
reply[#reply + 1] = cwnd
reply[#reply + 1] = math.max(0, pause - now)
reply[#reply + 1] = throttles
reply[#reply + 1] = last_throttle
reply[#reply + 1] = full_total
reply[#reply + 1] = dropped_total
reply[#reply + 1] = died_total
return reply

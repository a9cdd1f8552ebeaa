-- inspect: a read-only snapshot of one semaphore (expired entries are left out, not removed).
--
-- KEYS[1..3]: see _lib.lua.
-- ARGV: none.
--
-- Returns {now ms, used, limit_override or '', holder count, waiter count,
--          holders: token, lease expiry ms, weight, fencing token, acquired ms, owner JSON
--                   (repeated, by lease expiry),
--          waiters: ticket, place expiry ms, weight, since ms, wake data, owner JSON
--                   (repeated, FIFO order)}.
-- `used` counts only live holders.  Read-only, so it needs no care about the order of reads.
-- Cost: one pass over the state hash (live holders and waiters only; tombstones are not there).
now, now_text = now_ms()
redis.call('ZCARD', K_EXP)  -- read every key, so foreign data there is reported here too
local state = redis.call('HGETALL', K_STATE)
local order = redis.call('ZRANGE', K_LINE, 0, -1)

local fields, holder_fields, override = {}, {}, ''
for i = 1, #state, 2 do
  local field = state[i]
  local kind = string.sub(field, 1, 2)
  if kind == 'h:' or kind == 'w:' then
    fields[field] = state[i + 1]
  elseif field == 'limit_override' then
    override = state[i + 1]
  end
end

local function expiries(members)
  local out = {}
  for i, member in ipairs(members) do out[i] = redis.call('ZSCORE', K_EXP, member) end
  return out
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

local holders = {}
local live_used = 0
for _, entry in ipairs(live) do
  local raw = fields[entry[1]]
  local w, f, at, n, p = string.match(raw, '^(%d+) (%S+) (%S+) [01] (%d+) ()')
  live_used = live_used + tonumber(w)
  holders[#holders + 1] = string.sub(entry[1], 3)
  holders[#holders + 1] = entry[2]
  holders[#holders + 1] = tonumber(w)
  holders[#holders + 1] = f
  holders[#holders + 1] = at
  holders[#holders + 1] = string.sub(raw, p + tonumber(n))
end

local waiter_fields = {}
for i, ticket in ipairs(order) do waiter_fields[i] = 'w:' .. ticket end
local waiter_exp = expiries(waiter_fields)
local waiters = {}
for i, ticket in ipairs(order) do
  local expiry, raw = waiter_exp[i], fields[waiter_fields[i]]
  if expiry and raw and tonumber(expiry) > now then
    local info = parse_waiter(raw)
    waiters[#waiters + 1] = ticket
    waiters[#waiters + 1] = expiry
    waiters[#waiters + 1] = info.w
    waiters[#waiters + 1] = info.since
    waiters[#waiters + 1] = info.d
    waiters[#waiters + 1] = info.o
  end
end

local reply = {now, live_used, override, #holders / 6, #waiters / 6}
for _, v in ipairs(holders) do reply[#reply + 1] = v end
for _, v in ipairs(waiters) do reply[#reply + 1] = v end
return reply

-- inspect: a read-only snapshot of one semaphore (expired entries are left out, not removed).
--
-- KEYS[1..7]: see _lib.lua.
-- ARGV: none.
--
-- Returns {now ms, used, limit_override or '', holder count, waiter count,
--          holders: token, lease expiry ms, info JSON (repeated),
--          waiters: ticket, place expiry ms, info JSON (repeated, FIFO order)}.
-- `used` counts only live holders.
local err = check_types()
if err then return err end

local now = now_ms()
local holders = {}
local used = 0
local live = redis.call('ZRANGEBYSCORE', K_HOLDERS, '(' .. now, '+inf', 'WITHSCORES')
for i = 1, #live, 2 do
  local raw = redis.call('HGET', K_HINFO, live[i])
  if raw then
    used = used + cjson.decode(raw)['w']
    holders[#holders + 1] = live[i]
    holders[#holders + 1] = live[i + 1]
    holders[#holders + 1] = raw
  end
end
local waiters = {}
for _, ticket in ipairs(redis.call('ZRANGE', K_WAITERS, 0, -1)) do
  local expiry = redis.call('ZSCORE', K_WEXP, ticket)
  local raw = redis.call('HGET', K_WINFO, ticket)
  if expiry and raw and tonumber(expiry) > now then
    waiters[#waiters + 1] = ticket
    waiters[#waiters + 1] = expiry
    waiters[#waiters + 1] = raw
  end
end
local reply = {now, used, redis.call('HGET', K_META, 'limit_override') or '',
               #holders / 3, #waiters / 3}
for _, v in ipairs(holders) do reply[#reply + 1] = v end
for _, v in ipairs(waiters) do reply[#reply + 1] = v end
return reply

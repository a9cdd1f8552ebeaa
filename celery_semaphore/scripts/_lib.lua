-- Shared prelude, prepended to every script by celery_semaphore/_scripts.py.
--
-- KEYS (the same three for every script, all under one {hash tag}):
--   KEYS[1] expiry  ZSET  member -> expiry, server ms; the member's prefix says what expires:
--                           'h:'..token   a holder's lease; once released (no 'h:' field in
--                                         state any more), the token's tombstone
--                           'w:'..ticket  a waiter's place in line
--                           'd:'..token   a tombstone set aside by a new grant (see grant())
--   KEYS[2] state   HASH  counters:  used (units held), seq (arrival counter),
--                                    fence (grant counter), limit_override (runtime limit, optional)
--                         'h:'..token   a holder:  "<weight> <fence> <acquired ms> <aside>
--                                                   <#claim> <claim><owner>"
--                                       (aside: 1 when its grant set a tombstone aside)
--                         'w:'..ticket  a waiter:  "<weight> <since ms> <epoch> <woken ms> <grace ms>
--                                                   <#data> <data><owner>"
--                         (#x is the length of x in bytes; owner is JSON text, stored as given and
--                         never parsed here; data is the wake data, '' for a blocked waiter)
--   KEYS[3] line    ZSET  ticket -> arrival sequence number (FIFO order)
-- A holder has its 'h:' member in expiry and its 'h:' field in state; a waiter its 'w:' member,
-- its 'w:' field and its ticket in line; every script adds and removes them together.  A release
-- deletes the holder's field and turns its member into the tombstone (new score), so a tombstone
-- is a member of expiry only, and the state hash holds only live holders and waiters.
--
-- ARGV: each script documents its own; the Python side appends one more to every call, last:
--   ARGV[#ARGV] dispatch  '1' when the caller can wake parked waiters (it has an on_wake
--                         handler for their wake data), else '0': parked waiters are then not
--                         named (nor marked woken), and stay for a caller that can.
--
-- All time is the Redis server's TIME in integer milliseconds; no client clock is trusted.
-- Replies contain integers and strings only (RESP3 truncates Lua floats).
--
-- Foreign data: every script reads all three keys (begin() below) before its first write.  A key
-- that holds another type makes one of those reads fail with WRONGTYPE while nothing has been
-- written yet; the Python side then looks up which key it was (TYPE) and raises
-- SemaphoreStateError naming it.

local K_EXP, K_STATE, K_LINE = KEYS[1], KEYS[2], KEYS[3]

local CAN_DISPATCH = ARGV[#ARGV] == '1'

-- Set by begin(), then kept current by the script: server time (ms, and the same as text),
-- units held, the runtime limit override (false when none), waiters in line, holders reclaimed
-- by this call.
local now, now_text, used, limit_override, waiting, reclaimed = 0, '0', 0, false, 0, 0

-- Server time in integer ms, as a number and as text.  Built from TIME's digits: Lua's
-- number-to-text conversion is slow next to everything else the fast paths do.
local function now_ms()
  local t = redis.call('TIME')
  local text = t[1] .. string.sub('00000' .. t[2], -6, -4)  -- seconds, then whole ms
  return tonumber(text), text
end

-- Take back the units of holders whose lease ran out, forget waiters whose place expired, and
-- drop old tombstones: the `expired` members (vals: begin()'s HMGET reply for `...`, its
-- fields; those just removed are set to false there).  Reads first, like begin().
local function reclaim(expired, vals, ...)
  local raws = redis.call('HMGET', K_STATE, unpack(expired))
  local freed, tickets, gone = 0, {}, {}
  for i, member in ipairs(expired) do
    gone[member] = true
    local kind, raw = string.sub(member, 1, 2), raws[i]
    if kind == 'h:' then
      if raw then  -- a holder whose lease ran out (without a field: a tombstone's time is up)
        reclaimed = reclaimed + 1
        freed = freed + tonumber(string.match(raw, '^%d+'))
      end
    elseif kind == 'w:' then
      tickets[#tickets + 1] = string.sub(member, 3)
    end
  end
  redis.call('ZREM', K_EXP, unpack(expired))
  redis.call('HDEL', K_STATE, unpack(expired))
  if #tickets > 0 then waiting = waiting - redis.call('ZREM', K_LINE, unpack(tickets)) end
  if freed > 0 then
    used = math.max(0, used - freed)
    redis.call('HSET', K_STATE, 'used', used)
  end
  local fields = {...}
  for i = 1, #fields do
    if gone[fields[i]] then vals[i + 2] = false end
  end
end

-- The first thing every script does.  Reads the three keys (see "Foreign data" above), the
-- counters and the state fields `...` (at most three) the script asks for; then reclaims what
-- has expired: at most 64 entries per call (the next call continues), and nothing more than one
-- count when nothing has.  Returns the values of `...`, false where absent (or just reclaimed).
local function begin(...)
  now, now_text = now_ms()
  -- counting is cheaper than an empty range, and usually nothing has expired
  local expired = false
  if redis.call('ZCOUNT', K_EXP, '-inf', now_text) > 0 then
    expired = redis.call('ZRANGEBYSCORE', K_EXP, '-inf', now_text, 'LIMIT', 0, 64)
  end
  local vals = redis.call('HMGET', K_STATE, 'used', 'limit_override', ...)
  waiting = redis.call('ZCARD', K_LINE)
  -- all three keys have been read: from here on, writes are safe
  used = tonumber(vals[1]) or 0
  limit_override = vals[2]
  if expired then reclaim(expired, vals, ...) end
  return vals[3], vals[4], vals[5]
end

local function effective_limit(client_limit)
  if limit_override then return tonumber(limit_override) end
  return client_limit
end

-- A holder's state field: weight, fence, claim, aside (the owner is never needed here).
local function parse_holder(raw)
  local w, f, aside, n, p = string.match(raw, '^(%d+) (%S+) %S+ ([01]) (%d+) ()')
  return tonumber(w), tonumber(f), string.sub(raw, p, p + tonumber(n) - 1), aside == '1'
end

-- (weight as text, as the caller sent it; the usual empty claim spares a number conversion)
local function encode_holder(weight_text, fence, aside, claim, owner)
  local n = claim == '' and '0' or #claim
  return weight_text .. ' ' .. fence .. ' ' .. now_text .. ' ' .. aside .. ' ' .. n .. ' '
    .. claim .. owner
end

local function parse_waiter(raw)
  local w, since, e, wk, g, n, p =
    string.match(raw, '^(%d+) (%S+) (%S+) (%S+) (%S+) (%d+) ()')
  local stop = p + tonumber(n) - 1
  return {w = tonumber(w), since = since, e = tonumber(e), wk = tonumber(wk), g = tonumber(g),
          d = string.sub(raw, p, stop), o = string.sub(raw, stop + 1)}
end

local function encode_waiter(info)
  return info.w .. ' ' .. info.since .. ' ' .. info.e .. ' ' .. info.wk .. ' ' .. info.g .. ' '
    .. #info.d .. ' ' .. info.d .. info.o
end

-- Grant `weight` units to `ticket` (weight_text: the same, as sent; fence: the grant counter
-- before this grant).  Returns the new fencing token and lease expiry.
--
-- When the ticket was released recently, its 'h:' member is its tombstone, which the lease
-- must not overwrite: the tombstone is set aside as member 'd:'..ticket, same expiry, and the
-- holder remembers that (aside), so that its own release replaces it (the latest release's
-- tombstone is the one that counts, as if each release overwrote one tombstone per token).
local function grant(ticket, weight, weight_text, claim, owner, lease_ms, fence)
  fence = fence + 1
  used = used + weight
  local expiry = now + lease_ms
  local aside = '0'
  if redis.call('ZADD', K_EXP, 'NX', expiry, 'h:' .. ticket) == 0 then
    aside = '1'
    redis.call('ZADD', K_EXP, redis.call('ZSCORE', K_EXP, 'h:' .. ticket), 'd:' .. ticket)
    redis.call('ZADD', K_EXP, expiry, 'h:' .. ticket)
  end
  redis.call('HSET', K_STATE, 'used', used, 'fence', fence,
    'h:' .. ticket, encode_holder(weight_text, fence, aside, claim, owner))
  return fence, expiry
end

-- Is `token` remembered as released?  (Only asked when it is not held.)
local function tombstone(token)
  return redis.call('ZSCORE', K_EXP, 'h:' .. token) or redis.call('ZSCORE', K_EXP, 'd:' .. token)
end

local function drop_waiter(ticket)
  waiting = waiting - redis.call('ZREM', K_LINE, ticket)
  redis.call('ZREM', K_EXP, 'w:' .. ticket)
  redis.call('HDEL', K_STATE, 'w:' .. ticket)
end

-- The waiters that the free units belong to, in FIFO order.  Strict FIFO: when the head does
-- not fit, nobody behind it may pass, so a heavy waiter is never overtaken by a stream of light
-- ones.  A waiter heavier than the whole limit can never fit and is skipped (its own next
-- attempt reports the error).  Returns a list of {ticket, info-table}.
local function entitled(limit, units_used)
  local out = {}
  local free = limit - units_used
  if waiting <= 0 then return out end
  local start = 0
  while free > 0 do
    local batch = redis.call('ZRANGE', K_LINE, start, start + 15)
    if #batch == 0 then break end
    local fields = {}
    for i, ticket in ipairs(batch) do fields[i] = 'w:' .. ticket end
    local raws = redis.call('HMGET', K_STATE, unpack(fields))
    for i, ticket in ipairs(batch) do
      local raw = raws[i]
      if raw then
        local info = parse_waiter(raw)
        if info.w <= limit then
          if info.w > free then return out end
          free = free - info.w
          out[#out + 1] = {ticket, info}
          if free <= 0 then return out end
        end
      end
    end
    start = start + 16
  end
  return out
end

-- Of the entitled waiters other than `me`, those to wake now: each is named at most once per
-- `grace` ms, so a burst of calls does not send a burst of wake-ups.  Appends ticket, data
-- pairs to `reply`.
local function collect_wakes(list, me, grace, reply)
  local marks = {}
  for _, entry in ipairs(list) do
    local ticket, info = entry[1], entry[2]
    local parked = info.d ~= ''
    if ticket ~= me and (CAN_DISPATCH or not parked)
        and (now - (info.wk or 0)) >= (info.g or grace) then
      info.wk = now
      marks[#marks + 1] = 'w:' .. ticket
      marks[#marks + 1] = encode_waiter(info)
      reply[#reply + 1] = ticket
      reply[#reply + 1] = info.d
      if #marks >= 512 then  -- one HSET per 256 waiters: unpack() takes only so many values
        redis.call('HSET', K_STATE, unpack(marks))
        marks = {}
      end
    end
  end
  if #marks > 0 then redis.call('HSET', K_STATE, unpack(marks)) end
  return reply
end

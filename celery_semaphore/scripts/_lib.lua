-- Shared prelude, prepended to every script by celery_semaphore/_scripts.py.
--
-- KEYS (the same seven for every script, all under one {hash tag}):
--   KEYS[1] holders      ZSET  token  -> lease expiry, server ms
--   KEYS[2] holder_info  HASH  token  -> JSON {w=weight, at=acquired ms, f=fencing token,
--                                              c=claim, o=owner JSON text}
--   KEYS[3] waiters      ZSET  ticket -> arrival sequence number (FIFO order)
--   KEYS[4] waiter_exp   ZSET  ticket -> place expiry, server ms
--   KEYS[5] waiter_info  HASH  ticket -> JSON {w, since=first seen ms, e=epoch, o, d=wake data,
--                                              wk=last woken ms, g=wake grace ms}
--   KEYS[6] meta         HASH  used (units held), seq (arrival counter), fence (grant counter),
--                              limit_override (runtime limit, optional)
--   KEYS[7] done         ZSET  token  -> tombstone expiry, server ms (recently released tokens)
--
-- ARGV: each script documents its own; the Python side appends one more to every call, last:
--   ARGV[#ARGV] dispatch  '1' when the caller can wake parked waiters (it has an on_wake
--                         handler for their wake data), else '0': parked waiters are then not
--                         named (nor marked woken), and stay for a caller that can.
--
-- All time is the Redis server's TIME in integer milliseconds; no client clock is trusted.
-- Replies contain integers and strings only (RESP3 truncates Lua floats).

local K_HOLDERS, K_HINFO, K_WAITERS, K_WEXP, K_WINFO, K_META, K_DONE =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]

local CAN_DISPATCH = ARGV[#ARGV] == '1'

local EXPECTED_TYPES = {'zset', 'hash', 'zset', 'zset', 'hash', 'hash', 'zset'}

-- Refuse to touch keys that hold something we did not write: a script that fails half-way
-- would leave partial writes behind, so check every key before the first write.
local function check_types()
  for i = 1, 7 do
    local t = redis.call('TYPE', KEYS[i])
    if type(t) == 'table' then t = t['ok'] end
    if t ~= 'none' and t ~= EXPECTED_TYPES[i] then
      -- KEYS[i] goes last: a key prefix may contain spaces.
      return redis.error_reply(
        'CSWRONGTYPE ' .. i .. ' ' .. t .. ' ' .. EXPECTED_TYPES[i] .. ' ' .. KEYS[i])
    end
  end
  return nil
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function meta_int(field)
  return tonumber(redis.call('HGET', K_META, field) or '0') or 0
end

local function effective_limit(client_limit)
  local override = redis.call('HGET', K_META, 'limit_override')
  if override then return tonumber(override) end
  return client_limit
end

local function add_used(delta)
  local used = meta_int('used') + delta
  if used < 0 then used = 0 end
  redis.call('HSET', K_META, 'used', used)
  return used
end

local function drop_waiter(ticket)
  redis.call('ZREM', K_WAITERS, ticket)
  redis.call('ZREM', K_WEXP, ticket)
  redis.call('HDEL', K_WINFO, ticket)
end

-- Take back the units of holders whose lease ran out, forget waiters whose place expired, and
-- trim old tombstones.  Bounded per call; the next call continues.  Returns holders reclaimed.
local function reclaim(now)
  local expired = redis.call('ZRANGEBYSCORE', K_HOLDERS, '-inf', now, 'LIMIT', 0, 64)
  local freed = 0
  for _, token in ipairs(expired) do
    local raw = redis.call('HGET', K_HINFO, token)
    if raw then freed = freed + cjson.decode(raw)['w'] end
    redis.call('ZREM', K_HOLDERS, token)
    redis.call('HDEL', K_HINFO, token)
  end
  if freed > 0 then add_used(-freed) end
  local gone = redis.call('ZRANGEBYSCORE', K_WEXP, '-inf', now, 'LIMIT', 0, 64)
  for _, ticket in ipairs(gone) do drop_waiter(ticket) end
  redis.call('ZREMRANGEBYSCORE', K_DONE, '-inf', now)
  return #expired
end

-- The waiters that the free units belong to, in FIFO order.  Strict FIFO: when the head does
-- not fit, nobody behind it may pass, so a heavy waiter is never overtaken by a stream of light
-- ones.  A waiter heavier than the whole limit can never fit and is skipped (its own next
-- attempt reports the error).  Returns a list of {ticket, info-table}.
local function entitled(limit, used)
  local out = {}
  local free = limit - used
  local start = 0
  while free > 0 do
    local batch = redis.call('ZRANGE', K_WAITERS, start, start + 15)
    if #batch == 0 then break end
    for _, ticket in ipairs(batch) do
      local raw = redis.call('HGET', K_WINFO, ticket)
      if raw then
        local info = cjson.decode(raw)
        if info['w'] <= limit then
          if info['w'] > free then return out end
          free = free - info['w']
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
local function collect_wakes(list, me, now, grace, reply)
  for _, entry in ipairs(list) do
    local ticket, info = entry[1], entry[2]
    local parked = (info['d'] or '') ~= ''
    if ticket ~= me and (CAN_DISPATCH or not parked)
        and (now - (info['wk'] or 0)) >= (info['g'] or grace) then
      info['wk'] = now
      redis.call('HSET', K_WINFO, ticket, cjson.encode(info))
      reply[#reply + 1] = ticket
      reply[#reply + 1] = info['d'] or ''
    end
  end
  return reply
end

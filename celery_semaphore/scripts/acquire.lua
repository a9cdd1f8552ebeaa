-- acquire: grant a permit to `ticket` if the free units are its by FIFO order, else keep (or
-- refuse) its place in line.  Idempotent per (ticket, claim): a re-sent call whose first reply
-- was lost finds the grant it already made and returns it again.
--
-- KEYS[1..7]: see _lib.lua.
-- ARGV[1]  ticket         the waiter's identity; becomes the permit token when granted
-- ARGV[2]  weight         units wanted (integer >= 1)
-- ARGV[3]  limit          the caller's limit (a runtime limit_override in meta wins)
-- ARGV[4]  lease_ms       lease length for a grant
-- ARGV[5]  place_ttl_ms   how long the place in line lives without another call; 0 = do not
--                         queue: leave no trace when not granted now
-- ARGV[6]  claim          which copy of the caller this is (a grant remembers it)
-- ARGV[7]  owner          owner metadata, JSON text, stored as given
-- ARGV[8]  data           wake data for a parked waiter ('' = a blocked waiter, woken by list)
-- ARGV[9]  wake_grace_ms  name this waiter in wake-ups at most once per this many ms (kept
--                         with the place; also the default for other waiters named here)
-- ARGV[10] epoch          integer; a call whose epoch is below the place's epoch is stale
-- ARGV[11] check_done     1 = report a ticket released within its tombstone time as done
--
-- Returns {status, n1, n2, n3, n4, wake pairs...}:
--   status 1 granted now           n1 fencing token, n2 lease expiry ms, n3 server now ms
--   status 2 already held (claim)  n1 fencing token, n2 lease expiry ms, n3 server now ms
--   status 3 held by another claim n1 0
--   status 4 done: released before n1 0
--   status 5 waiting               n1 position (0 = head), n2 epoch of the place, n3 now ms
--   status 6 weight over limit     n1 effective limit
--   status 7 not granted, no place kept (place_ttl_ms = 0)
--   status 8 stale epoch           n1 epoch of the place
--   n4 = effective limit; then ticket, data pairs of other waiters to wake.
local err = check_types()
if err then return err end

local ticket, weight, client_limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local lease_ms, place_ttl = tonumber(ARGV[4]), tonumber(ARGV[5])
local claim, owner, data = ARGV[6], ARGV[7], ARGV[8]
local grace, epoch, check_done = tonumber(ARGV[9]), tonumber(ARGV[10]), ARGV[11] == '1'

local now = now_ms()
reclaim(now)
local limit = effective_limit(client_limit)

-- Every reply names the waiters to wake: the reclaim above may have freed units (an expired
-- lease or place) whatever this call's own outcome, and those units belong to waiters in line.
local function finish(reply, list)
  return collect_wakes(list or entitled(limit, meta_int('used')), ticket, now, grace, reply)
end

local held = redis.call('HGET', K_HINFO, ticket)
if held then
  local info = cjson.decode(held)
  if info['c'] ~= claim then return finish({3, 0, 0, now, limit}) end
  local expiry = now + lease_ms
  redis.call('ZADD', K_HOLDERS, 'XX', expiry, ticket)
  return finish({2, info['f'], expiry, now, limit})
end
if check_done and redis.call('ZSCORE', K_DONE, ticket) then
  return finish({4, 0, 0, now, limit})
end
if weight > limit then return finish({6, limit, 0, now, limit}) end

-- Fast path: nobody in line and room enough, so the grant cannot pass anyone.
if redis.call('ZCARD', K_WAITERS) == 0 then
  local used = meta_int('used')
  if used + weight <= limit then
    redis.call('HSET', K_META, 'used', used + weight)
    local fence = redis.call('HINCRBY', K_META, 'fence', 1)
    local expiry = now + lease_ms
    redis.call('ZADD', K_HOLDERS, expiry, ticket)
    redis.call('HSET', K_HINFO, ticket,
      cjson.encode({w = weight, at = now, f = fence, c = claim, o = owner}))
    return {1, fence, expiry, now, limit}
  end
end

local raw = redis.call('HGET', K_WINFO, ticket)
local info
if raw then
  info = cjson.decode(raw)
  if epoch < (info['e'] or 0) then return finish({8, info['e'], 0, now, limit}) end
  if info['d'] ~= data or info['e'] ~= epoch then info['wk'] = 0 end
  info['w'], info['e'], info['o'], info['d'], info['g'] = weight, epoch, owner, data, grace
else
  info = {w = weight, since = now, e = epoch, o = owner, d = data, wk = 0, g = grace}
  redis.call('ZADD', K_WAITERS, redis.call('HINCRBY', K_META, 'seq', 1), ticket)
end
redis.call('HSET', K_WINFO, ticket, cjson.encode(info))

local used = meta_int('used')
local list = entitled(limit, used)
local mine = false
for _, entry in ipairs(list) do
  if entry[1] == ticket then mine = true break end
end

if mine then
  drop_waiter(ticket)
  add_used(weight)
  local fence = redis.call('HINCRBY', K_META, 'fence', 1)
  local expiry = now + lease_ms
  redis.call('ZADD', K_HOLDERS, expiry, ticket)
  redis.call('HSET', K_HINFO, ticket,
    cjson.encode({w = weight, at = now, f = fence, c = claim, o = owner}))
  -- `list` still holds the other waiters the free units belong to
  return finish({1, fence, expiry, now, limit}, list)
end

if place_ttl > 0 then
  redis.call('ZADD', K_WEXP, now + place_ttl, ticket)
  return finish({5, redis.call('ZRANK', K_WAITERS, ticket), epoch, now, limit}, list)
end
drop_waiter(ticket)
-- Leaving the line (a ticket that had a place and now asks not to keep it) can hand the units
-- it stood in front of to those behind it: work out who is entitled again.
return finish({7, 0, 0, now, limit})

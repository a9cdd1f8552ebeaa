-- acquire: grant a permit to `ticket` if the free units are its (FIFO within its partition, fair
-- shares across partitions: see entitled() in _lib.lua), else keep (or refuse) its place in
-- line.  Idempotent per (ticket, claim): a re-sent call whose first reply
-- was lost finds the grant it already made and returns it again.
--
-- KEYS[1..4]: see _lib.lua.
-- ARGV[1]  ticket         the waiter's identity; becomes the permit token when granted
-- ARGV[2]  numbers        fifteen integers, space-separated (one argument: fewer to send):
--            weight         units wanted (>= 1)
--            limit          the caller's limit (a runtime limit_override in state wins)
--            lease_ms       lease length for a grant
--            place_ttl_ms   how long the place in line lives without another call; 0 = do not
--                           queue: leave no trace when not granted now
--            wake_grace_ms  name this waiter in wake-ups at most once per this many ms (kept
--                           with the place; also the default for other waiters named here)
--            epoch          a call whose epoch is below the place's epoch is stale
--            check_done     1 = report a ticket released within its tombstone time as done
--                           (and drop its place: the execution is over); 2 = this call
--                           starts a new execution of the ticket: an old tombstone is
--                           forgotten, so its later copies are not taken for the old one's;
--                           0 = neither
--            cap            the partition's cap (-1: none); stored with the partition
--            part_weight    the partition's weight (1..1000); stored with the partition
--            aging_ms       a head waiter that does not fit reserves the free units once it has
--                           waited this long (see entitled())
--            ready          1 = may be granted now; 0 = not ready: take or keep the place (its
--                           arrival number, so its turn) but never be granted or named while
--                           so; later waiters that are ready pass it (a worker with no free
--                           slot for the task), until a call with 1 makes it ready again
--            priority       0-9: a new place stands in its partition's line as if it had come
--                           offset_ms earlier (see KEYS[3] in _lib.lua); a kept place keeps
--                           its own
--            offset_ms      priority * the semaphore's priority step, ms
--            max_waiting    -1: no bound; else a new place is taken only while fewer than this
--                           many wait in its partition's line (counted and taken in this one
--                           step), else status 10 (or with keep_newest, see next)
--            keep_newest    1: when the line is full, its front waiters (other than this one)
--                           lose their places to make room (each is woken, and its next call
--                           learns it: status 9); 0: the newcomer is refused (status 10)
-- ARGV[3]  claim          which copy of the caller this is (a grant remembers it)
-- ARGV[4]  owner          owner metadata, JSON text, stored as given
-- ARGV[5]  data           wake data for a parked waiter ('' = a blocked waiter, woken by list)
-- ARGV[6]  partition      the waiter's partition ('' = the default one)
-- ARGV[7]  rate           the rate windows, "<count> <period ms> ..." ('' = no rate); stored
--                         as the state's 'rate' (the last acquirer's counts for every script),
--                         unless a runtime rate override is stored there: that one counts
-- ARGV[8]  live           "<liveness ttl ms> <ident>": the caller's process's liveness record
--                         (see K_PROCS in _lib.lua) is written now, and a grant is recorded
--                         under its ident; '' = none (the lease alone guards the grant)
--
-- Returns {status, n1, n2, n3, n4, n5, n6, wake pairs...}:
--   status 1 granted now           n1 fencing token, n2 lease expiry ms, n3 server now ms
--   status 2 already held (claim)  n1 fencing token, n2 lease expiry ms, n3 server now ms
--   status 3 held by another claim n1 0
--   status 4 done: released before n1 0
--   status 5 waiting               n1 position in its partition (0 = head), n2 epoch of the
--                                  place, n3 now ms
--   status 6 weight over limit     n1 effective limit
--   status 7 not granted, no place kept (place_ttl_ms = 0)
--   status 8 stale epoch           n1 epoch of the place
--   status 9 dropped               its place was taken by a newer waiter (keep_newest); no
--                                  place now (so answered for a minute after the place would
--                                  have expired: the ticket's copies all learn it)
--   status 10 full                 not granted, and the line was full (max_waiting): no place
--   n4 = effective limit (the runtime override, else the caller's; an adaptive limit lowers
--   only the units that may be held now, not this); n5 = for status 5, ms until every rate
--   window has room for this waiter's weight and a throttle pause is over (0: both are so
--   now, or no rate and no pause; -1: never); n6 = holders this call took back because their
--   lease expired (not those of dead processes); then ticket, data pairs of other waiters to
--   wake.

local ticket, claim, owner, data, part = ARGV[1], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local weight, client_limit, lease_ms, place_ttl, grace, epoch, check_done, cap, part_weight,
  aging, ready, priority, offset, max_waiting, keep_newest = string.match(ARGV[2],
    '^(%d+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+) (%S+) ([01]) (%d) (%d+) (%S+) ([01])$')
local weight_text = weight
weight, client_limit, lease_ms = tonumber(weight), tonumber(client_limit), tonumber(lease_ms)
place_ttl, grace, epoch = tonumber(place_ttl), tonumber(grace), tonumber(epoch)
cap, part_weight, aging = tonumber(cap), tonumber(part_weight), tonumber(aging)
offset, max_waiting = tonumber(offset), tonumber(max_waiting)
if not (weight and client_limit and lease_ms and place_ttl and grace and epoch and cap
    and part_weight and aging and offset and max_waiting) then
  return redis.error_reply('ERR acquire: ARGV[2] is not fifteen numbers: ' .. ARGV[2])
end
ready = ready == '1'
if not ready then data = '~' .. data end
local forget = check_done == '2'
check_done = check_done == '1'

rate_arg = ARGV[7]
name_rate_heads = false  -- the caller is a waiter: it does not wake the heads on each poll
local held, raw, fence, part_raw = F.begin('h:' .. ticket, 'w:' .. ticket, 'fence', 'p:' .. part)
fence = tonumber(fence) or 0
if K_PROCS and ARGV[8] ~= '' then F.live_caller(ARGV[8]) end
local limit = F.effective_limit(client_limit)
if rate_arg ~= (rate_stored or '') and not F.rate_overridden(rate_stored) then
  if rate then
    redis.call('HSET', K_STATE, 'rate', rate_arg)
  else
    redis.call('HDEL', K_STATE, 'rate')
  end
end

-- Every reply says how many holders begin() took back because their lease expired (the
-- caller logs them: nobody else will), and names the waiters to wake: the reclaim in begin()
-- may have freed units (an expired lease or place) whatever this call's own outcome, and those
-- units belong to waiters in line.
local lapsed = reclaimed - died
local function finish(reply, list)
  reply[7] = lapsed
  return F.collect_wakes(list or F.entitled(limit, aging), ticket, grace, reply)
end

if held then
  local _, held_fence, held_claim = F.parse_holder(held)
  if held_claim ~= claim then return finish({3, 0, 0, now, limit, 0}) end
  local expiry = now + lease_ms
  redis.call('ZADD', K_EXP, 'XX', expiry, 'h:' .. ticket)
  return finish({2, held_fence, expiry, now, limit, 0})
end
if check_done and F.tombstone(ticket) then
  if raw then F.drop_waiter(ticket, F.parse_waiter(raw)) end
  return finish({4, 0, 0, now, limit, 0})
end
if forget then F.forget_done(ticket) end
if not raw and redis.call('ZSCORE', K_EXP, 'x:' .. ticket) then
  -- its place was taken by a newer waiter (keep_newest): every copy of it learns so, until
  -- the mark expires (a minute after the place would have)
  return finish({9, 0, 0, now, limit, 0})
end
if weight > limit then return finish({6, limit, 0, now, limit, 0}) end

local info
if raw then
  info = F.parse_waiter(raw)
  if epoch < info.e then return finish({8, info.e, 0, now, limit, 0}) end
end

local record, part_used = F.partition_record(part, part_raw, cap, part_weight)
local room = cap < 0 or part_used + weight <= cap

-- Fast path: nobody in line and room enough, so the grant cannot pass anyone.  (With an
-- adaptive state, room under its lowered limit, or alone, and no pause: see entitled().)
local fits = used + weight <= limit
if aimd then fits = F.pause_left() == 0 and (used + weight <= F.adaptive_cap(limit) or used == 0) end
if ready and waiting == 0 and fits and room and (not rate or F.rate_budget() >= weight) then
  local granted, expiry =
    F.grant(ticket, weight, weight_text, claim, owner, lease_ms, fence, part, record)
  return {1, granted, expiry, now, limit, 0, lapsed}
end
F.store_record(part, part_raw, record)
local order = not info and F.new_order(offset, priority)
info = F.enqueue(ticket, info or false, weight, epoch, owner, data, grace, part, order)

local function entitled_now()
  local all = F.entitled(limit, aging)
  for _, entry in ipairs(all) do
    if entry[1] == ticket then return all, true end
  end
  return all, false
end
local list, mine = entitled_now()

-- A new place that is not granted now: is its line full (max_waiting)?  Counted with the
-- place just taken, in this same step, so callers on any node never let more wait.
local dropped = {}
if order and not mine and max_waiting >= 0 and place_ttl > 0 then
  local pre = F.part_prefix(part)
  local others = redis.call('ZLEXCOUNT', K_LINE, '[' .. pre, '(' .. pre .. '\255') - 1
  if others >= max_waiting and (keep_newest == '0' or max_waiting == 0) then
    F.drop_waiter(ticket, info)
    redis.call('HINCRBY', K_STATE, 'full', 1)
    return finish({10, 0, 0, now, limit, 0})
  end
  while others >= max_waiting do  -- keep_newest: the front waiters make room
    local front = redis.call('ZRANGEBYLEX', K_LINE, '[' .. pre, '(' .. pre .. '\255',
      'LIMIT', 0, 2)
    local _, _, gone = F.split_member(front[1])
    if gone == ticket then _, _, gone = F.split_member(front[2]) end
    local raw_gone = redis.call('HGET', K_STATE, 'w:' .. gone)
    local until_ms = tonumber(redis.call('ZSCORE', K_EXP, 'w:' .. gone)) or now
    local gone_info = F.parse_waiter(raw_gone)
    F.drop_waiter(gone, gone_info)
    redis.call('ZADD', K_EXP, math.max(until_ms, now) + 60000, 'x:' .. gone)
    redis.call('HINCRBY', K_STATE, 'dropped', 1)
    local gone_data = F.wake_data(gone_info)
    if CAN_DISPATCH or gone_data == '' then
      dropped[#dropped + 1] = gone
      dropped[#dropped + 1] = gone_data
    end
    others = others - 1
  end
  list, mine = entitled_now()
end
if #dropped > 0 then
  local base = finish
  finish = function(reply, l)
    base(reply, l)
    for _, v in ipairs(dropped) do reply[#reply + 1] = v end
    return reply
  end
end

if mine then
  -- grant first: the partition then has a holder, so leaving the line keeps its record
  local granted, expiry =
    F.grant(ticket, weight, weight_text, claim, owner, lease_ms, fence, part, record)
  F.drop_waiter(ticket, info)
  -- `list` still holds the other waiters the free units belong to
  local blocked = rate_blocked  -- (finish() clears it)
  local reply = finish({1, granted, expiry, now, limit, 0}, list)
  -- a start that used up the rate's room: the next heads learn when their window opens (see
  -- name_heads())
  if blocked and waiting > 0 then F.name_heads(list, ticket, reply) end
  return reply
end

if place_ttl > 0 then
  redis.call('ZADD', K_EXP, now + place_ttl, 'w:' .. ticket)
  local retry = F.rate_wait(weight)
  if retry >= 0 and aimd then retry = math.max(retry, F.pause_left()) end
  return finish({5, F.position(ticket, info), epoch, now, limit, retry}, list)
end
F.drop_waiter(ticket, info)
-- Leaving the line (a ticket that had a place and now asks not to keep it) can hand the units
-- it stood in front of to those behind it: work out who is entitled again.
return finish({7, 0, 0, now, limit, 0})

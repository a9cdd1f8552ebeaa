-- Shared prelude, prepended to every script by celery_semaphore/_scripts.py.
--
-- KEYS (the same four for every script, all under one {hash tag}):
--   KEYS[1] expiry  ZSET  member -> expiry, server ms; the member's prefix says what expires:
--                           'h:'..token   a holder's lease; once released (no 'h:' field in
--                                         state any more), the token's tombstone
--                           'w:'..ticket  a waiter's place in line
--                           'd:'..token   a tombstone set aside by a new grant (see grant())
--                           'x:'..ticket  a waiter whose place another took (acquire.lua's
--                                         keep_newest): its next call learns so (DROPPED)
--   KEYS[2] state   HASH  counters:  used (units held), seq (arrival counter),
--                                    fence (grant counter), limit_override (runtime limit, optional),
--                                    pused (units held by partitions other than ''),
--                                    hold_avg (moving average of hold times, ms: each release
--                                    moves it 1/8 of the way to its hold; absent before the
--                                    first release), reclaimed (leases taken back after expiry,
--                                    ever; absent before the first),
--                                    rate (the rate windows, "<count> <period ms> ..." by
--                                    period, a spaced window's period followed by 's' (see
--                                    "Rates" below); written by acquire.lua, the last acquirer's
--                                    counts; absent: no rate; "=<count> <period ms> ...": a
--                                    runtime rate override, which acquire.lua never
--                                    overwrites: only set_rate_override(None) removes it),
--                                    aimd (the adaptive state, see "Adaptive limits" below;
--                                    absent: the limit is not lowered and nothing paused),
--                                    throttles ("<total> <last ms>": throttle.lua calls ever
--                                    and the server time of the last; absent before the first)
--                         'h:'..token   a holder:  "<weight> <fence> <acquired ms> <aside>
--                                                   <#claim> <#partition> <claim><partition><owner>"
--                                       (aside: 1 when its grant set a tombstone aside)
--                         'w:'..ticket  a waiter:  "<weight> <since ms> <epoch> <woken ms> <grace ms>
--                                                   <seq> <#partition> <#data>
--                                                   <partition><data><owner>"
--                         'p:'..name    a partition: "<used> <cap> <weight>" (cap -1: none);
--                                       present while the partition has holders or waiters
--                                       (for '' only when its cap or weight is not the default;
--                                       its used is then 0 here: used - pused is what it holds)
--                         (#x is the length of x in bytes; owner is JSON text, stored as given and
--                         never parsed here; data is the wake data, '' for a blocked waiter; a
--                         leading '~' marks a waiter that is not ready (see acquire.lua): it keeps
--                         its place, but entitled() passes over it, so it is never granted or
--                         named; the data after the '~' is its wake data)
--   KEYS[3] line    ZSET  all scores 0, so ordered by member, which is
--                           <#partition, 4 digits><partition><order><ticket>
--                         : grouped by partition, by order within one.  One ZRANGEBYLEX finds
--                         the head of a partition, or of the next partition.  <order> (the
--                         waiter field's <seq>, compared as text) is either
--                           '1' <key, 14 digits> <seq, 15 digits> <priority, 1 digit>
--                         with key = arrival ms + 10^13 - priority * priority step ms (a
--                         higher priority stands as if it had come that much earlier), or,
--                         in lines written before priorities, <seq, 15 digits>, which starts
--                         with '0' and so sorts before every keyed member (they came first).
--   KEYS[4] starts  ZSET  only used while a rate is set: one member per start (grant), score =
--                         its server ms (with a spaced window: its due time, see "Rates"
--                         below, less than 1 ms later and fractional), member = <total weight
--                         started so far, this start included, 17 digits> <weight>; so the
--                         starts after a time are (the last member's total) - (the first such
--                         member's total - weight).
--                         Members older than the longest window are trimmed at each start, and
--                         the key expires one longest window (+ 1 s) after the last start.
-- A holder has its 'h:' member in expiry and its 'h:' field in state; a waiter its 'w:' member,
-- its 'w:' field and its member in line; every script adds and removes them together.  A release
-- deletes the holder's field and turns its member into the tombstone (new score), so a tombstone
-- is a member of expiry only, and the state hash holds only live holders, waiters and the records
-- of partitions that have either.
--
-- Fair sharing (see entitled()): free units go to the partition with waiters whose units held
-- per unit of partition weight (used_p / weight_p) is the lowest, one head waiter at a time;
-- FIFO within a partition; a partition never holds more than its cap.
--
-- ARGV: each script documents its own; the Python side appends one more to every call, last:
--   ARGV[#ARGV] dispatch  '1' when the caller can wake parked waiters (it has an on_wake
--                         handler for their wake data), else '0': parked waiters are then not
--                         named (nor marked woken), and stay for a caller that can.
--
-- Adaptive limits (docs/concepts.md, "Adaptive limits"): the state's 'aimd' field is
--   "<cwnd> <acc> <dec_fence> <dec_until ms> <pause_until ms>":
--     cwnd        the lowered limit (0: not lowered); grants obey min(cwnd, the limit)
--     acc         units released successfully since cwnd last grew (+1 once acc reaches cwnd)
--     dec_fence   the grant counter at the last decrease: only permits granted after it (a
--                 higher fencing token) count as successes, or lower cwnd again
--     dec_until   until then a throttle without a permit lowers nothing (same episode)
--     pause_until nobody starts before this server time
--   Written by throttle.lua (the decrease, the pause) and by releases (the increase); removed
--   by begin() once cwnd is 0 and both times have passed.  Read by begin() with the counters:
--   without it, the only cost of the feature is that one field of the HMGET.
--
-- All time is the Redis server's TIME in integer milliseconds; no client clock is trusted.
-- Replies contain integers and strings only (RESP3 truncates Lua floats).
--
-- Foreign data: every script reads all three keys (begin() below) before its first write.  A key
-- that holds another type makes one of those reads fail with WRONGTYPE while nothing has been
-- written yet; the Python side then looks up which key it was (TYPE) and raises
-- SemaphoreStateError naming it.

-- Every script run creates its functions anew (Lua closures), and each upvalue a closure
-- captures costs at that moment; the functions are therefore fields of the table F (one
-- upvalue, where locals calling each other would be many), and only those the usual uncontended
-- acquire and release need are made at every run (the ones just below).  The others are made by
-- define_rest(), the first time the script asks F for one of them (F's __index): a script never
-- sees the difference, except in its running time.
local F = {}

local K_EXP, K_STATE, K_LINE, K_RATE = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
-- The liveness records of the key prefix (docs/concepts.md, "Liveness"): a ZSET, member = a
-- process's ident, score = the server ms at which its record expires.  Declared last, after
-- the four keys of the semaphore (KEYS[5]), only when the caller's liveness is on (never on a
-- Redis Cluster, where it cannot share a script with a semaphore's keys); false otherwise.
-- A record is written before its process's first grant (acquire.lua writes it in the same
-- step), so a holder whose ident has no record, or an expired one, belongs to a dead process.
local K_PROCS = KEYS[#KEYS]
if #KEYS % 4 ~= 1 or #KEYS < 5 then K_PROCS = false end

local CAN_DISPATCH = ARGV[#ARGV] == '1'

-- Set by begin(), then kept current by the script: server time (ms, and the same as text),
-- units held, the runtime limit override (false when none), waiters in line, holders reclaimed
-- by this call, units held by partitions other than '', the record of partition '' (false: the
-- default, no cap and weight 1).
local now, now_text, used, limit_override, waiting, reclaimed = 0, '0', 0, false, 0, 0
local pused, default_record = 0, false
-- The rate, set by begin(): false (none), or {windows = {{count, period ms, spaced}...},
-- max_p = the longest period, min_n = the smallest count, space = the interval per unit of
-- weight of the slowest spaced window (period / count, ms; false: none is spaced), text = as
-- stored}; rate_total, rate_last and rate_last_w: the total weight started, the score and the
-- weight of the last start (the starts key's last member).  A script that sets a rate
-- (acquire.lua) puts its text in rate_arg before calling begin().
local rate, rate_total, rate_last, rate_arg, rate_stored = false, 0, 0, nil, false
local rate_last_w = 0
-- Set by entitled(): the rate left free units unserved (see name_heads()); name_rate_heads:
-- collect_wakes() then names the heads (a script whose caller is a waiter polling turns it off).
local rate_blocked, name_rate_heads = false, true
-- The adaptive state, set by begin(): false (no 'aimd' field), or {cwnd, acc, fence, till,
-- pause} (see "Adaptive limits" above).
local aimd = false
-- The state's 'live' field, decoded by begin(): {ident = {token, ...}}, the holders granted
-- with a liveness ident, by ident (false: none); live_of: token -> ident; dead: the idents
-- whose record has expired (read by begin() when K_PROCS); died: holders reclaimed by this call
-- because their process's record expired; grant_ident: set by acquire.lua before a grant.
local live, live_of, dead, died, grant_ident = false, false, false, 0, false

-- Group scripts work on several semaphores, four KEYS each (member i: KEYS[4i-3 .. 4i]); use(i)
-- makes member i the one every function here works on, keeping each member's counters.
local members, current = {}, 1

-- Server time in integer ms, as a number and as text.  Built from TIME's digits: Lua's
-- number-to-text conversion is slow next to everything else the fast paths do.
function F.now_ms()
  local t = redis.call('TIME')
  local text = t[1] .. string.sub('00000' .. t[2], -6, -4)  -- seconds, then whole ms
  return tonumber(text), text
end

-- A holder's state field: weight, fence, claim, aside, partition, acquired ms (as text; the
-- owner is never needed).
function F.parse_holder(raw)
  local w, f, at, aside, n, np, p =
    string.match(raw, '^(%d+) (%S+) (%S+) ([01]) (%d+) (%d+) ()')
  local stop = p + tonumber(n)
  return tonumber(w), tonumber(f), string.sub(raw, p, stop - 1), aside == '1',
    string.sub(raw, stop, stop + tonumber(np) - 1), at
end

-- (weight as text, as the caller sent it; the usual empty claim and partition spare a number
-- conversion)
function F.encode_holder(weight_text, fence, aside, claim, part, owner)
  local n = claim == '' and '0' or #claim
  local np = part == '' and '0' or #part
  return weight_text .. ' ' .. fence .. ' ' .. now_text .. ' ' .. aside .. ' ' .. n .. ' '
    .. np .. ' ' .. claim .. part .. owner
end

-- Is this stored rate text a runtime override ("=...")?
function F.rate_overridden(text)
  return text and string.sub(text, 1, 1) == '='
end

-- The rate windows of a rate text ("<count> <period ms>[s] ...", an override's with a
-- leading '='), or false for ''.
function F.parse_rate(text)
  if not text or text == '' then return false end
  local windows, max_p, min_n, space = {}, 0, math.huge, false
  for n, p, s in string.gmatch(text, '(%d+) (%d+)(s?)') do
    n, p = tonumber(n), tonumber(p)
    windows[#windows + 1] = {n, p, s == 's'}
    if p > max_p then max_p = p end
    if n < min_n then min_n = n end
    if s == 's' and (not space or p / n > space) then space = p / n end
  end
  if #windows == 0 then return false end
  return {windows = windows, max_p = max_p, min_n = min_n, space = space, text = text}
end

-- The last start (the starts key's last member) into rate_total, rate_last, rate_last_w.
function F.read_last_start()
  rate_total, rate_last, rate_last_w = 0, 0, 0
  local last = redis.call('ZRANGE', K_RATE, -1, -1, 'WITHSCORES')
  if last[1] then
    local total, w = string.match(last[1], '^(%d+) (%d+)')
    rate_total, rate_last_w = tonumber(total) or 0, tonumber(w) or 0
    rate_last = tonumber(last[2]) or 0
  end
end

-- The first thing every script does.  Reads the keys (see "Foreign data" above; the starts key
-- only when a rate is set), the counters and the state fields `...` the script asks for; then
-- reclaims what has expired: at most 64 entries per call (the next call continues), and
-- nothing more than one count when nothing has.  Returns the values of `...`, false where
-- absent (or just reclaimed).
function F.begin(...)
  now, now_text = F.now_ms()
  -- counting is cheaper than an empty range, and usually nothing has expired
  local expired = false
  if redis.call('ZCOUNT', K_EXP, '-inf', now_text) > 0 then
    expired = redis.call('ZRANGEBYSCORE', K_EXP, '-inf', now_text, 'LIMIT', 0, 64)
  end
  local vals = redis.call('HMGET', K_STATE, 'used', 'limit_override', 'pused', 'p:', 'rate',
    'aimd', 'live', ...)
  waiting = redis.call('ZCARD', K_LINE)
  rate_stored = vals[5]
  if rate_arg ~= nil and not F.rate_overridden(rate_stored) then
    rate = F.parse_rate(rate_arg)
  else
    rate = F.parse_rate(rate_stored)
  end
  rate_total, rate_last, rate_last_w = 0, 0, 0
  if rate then F.read_last_start() end
  -- all the keys have been read: from here on, writes are safe
  used = tonumber(vals[1]) or 0
  limit_override = vals[2]
  pused = tonumber(vals[3]) or 0
  default_record = vals[4]
  live, live_of, dead = false, false, false
  if vals[7] then F.load_live(vals[7]) end
  aimd = false
  if vals[6] then
    local c, a, f, u, p = string.match(vals[6], '^(%d+) (%d+) (%d+) (%d+) (%d+)$')
    if c then
      aimd = {cwnd = tonumber(c), acc = tonumber(a), fence = tonumber(f), till = tonumber(u),
              pause = tonumber(p)}
    end
    -- nothing lowered, paused or remembered any more (or unreadable): forget it
    if not aimd or (aimd.cwnd == 0 and aimd.pause <= now and aimd.till <= now) then
      redis.call('HDEL', K_STATE, 'aimd')
      aimd = false
    end
  end
  if expired then F.reclaim(expired, vals, ...) end
  if dead then F.reclaim_dead(vals, ...) end
  return unpack(vals, 8, 7 + select('#', ...))
end

-- The limit in force: the runtime override, else the caller's.  (An adaptive limit lowers
-- only how many units may be granted now: see adaptive_cap(); a weight is checked against
-- this one.)
function F.effective_limit(client_limit)
  if limit_override then return tonumber(limit_override) end
  return client_limit
end

-- Grant `weight` units to `ticket` (weight_text: the same, as sent; fence: the grant counter
-- before this grant) in partition `part`, whose record (for a partition other than '') is
-- `record` = {used, cap, weight}.  Returns the new fencing token and lease expiry.
--
-- When the ticket was released recently, its 'h:' member is its tombstone, which the lease
-- must not overwrite: the tombstone is set aside as member 'd:'..ticket, same expiry, and the
-- holder remembers that (aside), so that its own release replaces it (the latest release's
-- tombstone is the one that counts, as if each release overwrote one tombstone per token).
function F.grant(ticket, weight, weight_text, claim, owner, lease_ms, fence, part, record)
  fence = fence + 1
  used = used + weight
  if rate then F.rate_record(weight) end
  local expiry = now + lease_ms
  local aside = '0'
  if redis.call('ZADD', K_EXP, 'NX', expiry, 'h:' .. ticket) == 0 then
    aside = '1'
    redis.call('ZADD', K_EXP, redis.call('ZSCORE', K_EXP, 'h:' .. ticket), 'd:' .. ticket)
    redis.call('ZADD', K_EXP, expiry, 'h:' .. ticket)
  end
  local holder = F.encode_holder(weight_text, fence, aside, claim, part, owner)
  if grant_ident then F.live_add(ticket, grant_ident) end
  if part == '' then
    redis.call('HSET', K_STATE, 'used', used, 'fence', fence, 'h:' .. ticket, holder)
  else
    pused = pused + weight
    record[1] = record[1] + weight
    redis.call('HSET', K_STATE, 'used', used, 'fence', fence, 'h:' .. ticket, holder,
      'pused', pused, 'p:' .. part, record[1] .. ' ' .. record[2] .. ' ' .. record[3])
  end
  return fence, expiry
end

-- Is `token` remembered as released?  (Only asked when it is not held.)
function F.tombstone(token)
  return redis.call('ZSCORE', K_EXP, 'h:' .. token) or redis.call('ZSCORE', K_EXP, 'd:' .. token)
end

-- The partition's record takes this acquirer's cap (-1: none) and weight (the last writer's
-- count); the default partition has one only when they are not the defaults (written here),
-- another partition always (its used count too: written by store_record() or grant()).
-- part_raw: its record as read.  Returns the record table for grant() (nil for '') and the
-- units the partition holds.
function F.partition_record(part, part_raw, cap, part_weight)
  if part ~= '' then
    local part_used = F.parse_part(part_raw)
    return {part_used, cap, part_weight}, part_used
  end
  if cap < 0 and part_weight == 1 then
    if part_raw then
      redis.call('HDEL', K_STATE, 'p:')
      default_record = false
    end
  else
    local wanted = '0 ' .. cap .. ' ' .. part_weight
    if part_raw ~= wanted then
      redis.call('HSET', K_STATE, 'p:', wanted)
      default_record = wanted
    end
  end
  return nil, used - pused
end

-- Release the holder `token` (held: its state field, or false; hold_avg: the state's 'hold_avg'
-- field as read, or false; timed: whether this release ends a hold worth timing).  Returns 1
-- released now, 2 released already (tombstone), 0 not held, 3 held under another claim (claim
-- '' matches any).  Only a timed release now (1) counts its hold time (now - acquired) into
-- hold_avg: an exponential moving average, alpha 1/8, in integer ms (the first sets it); and
-- it is a success for an adaptive limit (see aimd_success(); limit: the limit in force).
function F.release_holder(token, held, claim, tomb_ms, hold_avg, timed, limit)
  if not held then
    if F.tombstone(token) then return 2 end
    return 0
  end
  local weight, held_fence, held_claim, aside, part, at = F.parse_holder(held)
  if claim ~= '' and held_claim ~= claim then return 3 end
  -- the holder's member becomes the tombstone (tombstone_ms 0: gone at the next call)
  used = math.max(0, used - weight)
  if timed then
    local hold = math.max(0, now - (tonumber(at) or now))
    local avg = tonumber(hold_avg)
    if avg then avg = math.floor((7 * avg + hold + 4) / 8) else avg = hold end
    redis.call('HSET', K_STATE, 'used', used, 'hold_avg', avg)
  else
    redis.call('HSET', K_STATE, 'used', used)
  end
  redis.call('HDEL', K_STATE, 'h:' .. token)
  if live_of and live_of[token] then F.live_drop(token) end
  redis.call('ZADD', K_EXP, now + tomb_ms, 'h:' .. token)
  if aside then redis.call('ZREM', K_EXP, 'd:' .. token) end  -- this release's counts now
  if part ~= '' then F.set_pused(math.max(0, pused - weight)) end
  if part ~= '' or default_record then F.part_changed(part, weight) end
  if timed and aimd then F.aimd_success(weight, held_fence, limit) end
  return 1
end

-- Liveness (docs/concepts.md, "Liveness"): every acquire and release of a worker's tasks
-- reads and writes it, so its functions are made at every run, with the fast paths'.

-- The state's 'live' field (`raw`, JSON) into live and live_of; with K_PROCS, the idents whose
-- record has expired (or is gone) into dead.  One ZSCORE per process holding units here.
function F.load_live(raw)
  local ok, value = pcall(cjson.decode, raw)
  if not ok or type(value) ~= 'table' then return end
  live, live_of = value, {}
  for ident, tokens in pairs(value) do
    for _, token in ipairs(tokens) do live_of[token] = ident end
    if K_PROCS then
      local score = redis.call('ZSCORE', K_PROCS, ident)
      if not score or tonumber(score) <= now then
        dead = dead or {}
        dead[#dead + 1] = ident
      end
    end
  end
end

function F.store_live()
  if next(live) == nil then
    redis.call('HDEL', K_STATE, 'live')
    live, live_of = false, false
  else
    redis.call('HSET', K_STATE, 'live', cjson.encode(live))
  end
end

-- `token` was granted to a process with liveness ident `ident`.
function F.live_add(token, ident)
  if not live then live, live_of = {}, {} end
  local tokens = live[ident]
  if not tokens then
    tokens = {}
    live[ident] = tokens
  end
  tokens[#tokens + 1] = token
  live_of[token] = ident
  F.store_live()
end

-- `token` holds no more (released or reclaimed).
function F.live_drop(token)
  local ident = live_of[token]
  live_of[token] = nil
  local tokens, kept = live[ident] or {}, {}
  for _, t in ipairs(tokens) do
    if t ~= token then kept[#kept + 1] = t end
  end
  if #kept == 0 then live[ident] = nil else live[ident] = kept end
  F.store_live()
end

-- acquire.lua's liveness argument ("<ttl ms> <ident>", '' for none): the caller's record is
-- written (extended, never shortened) before it is granted anything, and its grants are
-- recorded under its ident.  Without K_PROCS (liveness off, or a Redis Cluster) nothing.
function F.live_caller(arg)
  if not K_PROCS or arg == nil or arg == '' then return end
  local ttl, ident = string.match(arg, '^(%d+) (%S+)$')
  if not ttl then return end
  local until_ms = now + tonumber(ttl)
  local score = tonumber(redis.call('ZSCORE', K_PROCS, ident))
  if not score or score < until_ms then redis.call('ZADD', K_PROCS, until_ms, ident) end
  grant_ident = ident
end

-- The functions of the slower paths (waiting in line, partitions, rates, adaptive limits,
-- reclaiming, wake-ups): made on first use, see F above.
local function define_rest()

-- The holders of the processes in `dead` are reclaimed now (at most 64 per call, the next call
-- continues), as an expired lease is, and counted in the state's 'died'; the dead records are
-- removed from K_PROCS (absent means dead: see K_PROCS).
function F.reclaim_dead(vals, ...)
  local members = {}
  for _, ident in ipairs(dead) do
    for _, token in ipairs(live[ident] or {}) do
      if #members < 64 then members[#members + 1] = 'h:' .. token end
    end
  end
  redis.call('ZREM', K_PROCS, unpack(dead))
  dead = false
  if #members == 0 then return end
  local before = reclaimed
  F.reclaim(members, vals, ...)
  died = died + reclaimed - before
  if reclaimed > before then redis.call('HINCRBY', K_STATE, 'died', reclaimed - before) end
end

function F.use(i)
  if i == current then return end
  members[current] = {used, limit_override, waiting, reclaimed, pused, default_record, rate,
                      rate_total, rate_last, rate_stored, aimd, rate_last_w, live, live_of}
  K_EXP, K_STATE, K_LINE, K_RATE = KEYS[4 * i - 3], KEYS[4 * i - 2], KEYS[4 * i - 1], KEYS[4 * i]
  local saved = members[i]
  if saved then
    used, limit_override, waiting, reclaimed, pused, default_record, rate, rate_total,
      rate_last, rate_stored, aimd, rate_last_w, live, live_of = unpack(saved, 1, 14)
  else
    used, limit_override, waiting, reclaimed, pused, default_record = 0, false, 0, 0, 0, false
    rate, rate_total, rate_last, rate_stored, aimd, rate_last_w = false, 0, 0, false, false, 0
    live, live_of = false, false
  end
  current = i
end

-- The line member's prefix for a partition (every member of it starts with this, and no
-- member of another partition does: the length comes first).
function F.part_prefix(part)
  return string.format('%04d', #part) .. part
end

-- (seq: the waiter's order text, see KEYS[3] above)
function F.line_member(part, seq, ticket)
  return F.part_prefix(part) .. seq .. ticket
end

-- partition, order (text), ticket and prefix of a line member (a keyed order starts with '1',
-- 49, and is 31 characters long; an older one 15)
function F.split_member(member)
  local n = tonumber(string.sub(member, 1, 4))
  local len = string.byte(member, 5 + n) == 49 and 31 or 15
  return string.sub(member, 5, 4 + n), string.sub(member, 5 + n, 4 + n + len),
    string.sub(member, 5 + n + len), string.sub(member, 1, 4 + n)
end

-- The order text of a new place: arrival now, `offset_ms` earlier for its priority (0-9).
function F.new_order(offset_ms, priority)
  local seq = redis.call('HINCRBY', K_STATE, 'seq', 1)
  return '1' .. string.format('%014d', now + 10000000000000 - offset_ms)
    .. string.format('%015d', seq) .. priority
end

function F.part_has_waiters(part)
  local pre = F.part_prefix(part)
  return redis.call('ZRANGEBYLEX', K_LINE, '[' .. pre, '(' .. pre .. '\255', 'LIMIT', 0, 1)[1]
    ~= nil
end

-- A partition record: used, cap (false: none), weight.
function F.parse_part(raw)
  if not raw then return 0, false, 1 end
  local u, c, w = string.match(raw, '^(%S+) (%S+) (%S+)$')
  c = tonumber(c)
  if c < 0 then c = false end
  return tonumber(u), c, tonumber(w)
end

function F.set_pused(value)
  pused = value
  if value > 0 then
    redis.call('HSET', K_STATE, 'pused', value)
  else
    redis.call('HDEL', K_STATE, 'pused')
  end
end

-- `part` gave back `units` held units (used and pused are the caller's business), and may have
-- lost its last waiter: keep its record only while it has holders or waiters.
function F.part_changed(part, units)
  if part == '' then
    if default_record and used - pused <= 0 and not F.part_has_waiters('') then
      redis.call('HDEL', K_STATE, 'p:')
      default_record = false
    end
    return
  end
  local field = 'p:' .. part
  local raw = redis.call('HGET', K_STATE, field)
  if not raw then return end
  local u, c, w = F.parse_part(raw)
  u = math.max(0, u - units)
  if u == 0 and not F.part_has_waiters(part) then
    redis.call('HDEL', K_STATE, field)
  elseif units > 0 then
    redis.call('HSET', K_STATE, field, u .. ' ' .. (c or -1) .. ' ' .. w)
  end
end

function F.parse_waiter(raw)
  local w, since, e, wk, g, seq, np, n, p =
    string.match(raw, '^(%d+) (%S+) (%S+) (%S+) (%S+) (%d+) (%d+) (%d+) ()')
  local pstop = p + tonumber(np)
  local stop = pstop + tonumber(n)
  return {w = tonumber(w), since = since, e = tonumber(e), wk = tonumber(wk), g = tonumber(g),
          seq = #seq == 31 and seq or string.format('%015d', seq),
          p = string.sub(raw, p, pstop - 1),
          d = string.sub(raw, pstop, stop - 1), o = string.sub(raw, stop)}
end

-- Is the waiter ready (see the state's 'w:' fields above)?  (126 is '~'.)
function F.ready(info)
  return string.byte(info.d, 1) ~= 126
end

-- A waiter's wake data, without the not-ready mark.
function F.wake_data(info)
  if F.ready(info) then return info.d end
  return string.sub(info.d, 2)
end

function F.encode_waiter(info)
  return info.w .. ' ' .. info.since .. ' ' .. info.e .. ' ' .. info.wk .. ' ' .. info.g .. ' '
    .. info.seq .. ' ' .. #info.p .. ' ' .. #info.d .. ' ' .. info.p .. info.d .. info.o
end

-- Take back the units of holders whose lease ran out, forget waiters whose place expired, and
-- drop old tombstones: the `expired` members (vals: begin()'s HMGET reply for `...`, its
-- fields; those just removed are set to false there, and partition records re-read).  Reads
-- first, like begin().  Adds the holders reclaimed to the state's running total `reclaimed`
-- (read with the expired fields, written with `used`: no extra call).
function F.reclaim(expired, vals, ...)
  -- raws[1]: the running total; raws[i + 1]: expired[i]'s field
  local raws = redis.call('HMGET', K_STATE, 'reclaimed', unpack(expired))
  local freed, members, gone, count = 0, {}, {}, 0
  local parts, part_freed = {}, 0  -- partition -> units freed (0: lost a waiter)
  for i, member in ipairs(expired) do
    gone[member] = true
    local kind, raw = string.sub(member, 1, 2), raws[i + 1]
    if kind == 'h:' then
      if raw then  -- a holder whose lease ran out (without a field: a tombstone's time is up)
        if live_of and live_of[string.sub(member, 3)] then F.live_drop(string.sub(member, 3)) end
        reclaimed = reclaimed + 1
        count = count + 1
        local w, _, _, _, part = F.parse_holder(raw)
        freed = freed + w
        parts[part] = (parts[part] or 0) + w
        if part ~= '' then part_freed = part_freed + w end
      end
    elseif kind == 'w:' and raw then
      local info = F.parse_waiter(raw)
      members[#members + 1] = F.line_member(info.p, info.seq, string.sub(member, 3))
      parts[info.p] = parts[info.p] or 0
    end
  end
  redis.call('ZREM', K_EXP, unpack(expired))
  redis.call('HDEL', K_STATE, unpack(expired))
  if #members > 0 then waiting = waiting - redis.call('ZREM', K_LINE, unpack(members)) end
  if freed > 0 or count > 0 then
    used = math.max(0, used - freed)
    redis.call('HSET', K_STATE, 'used', used, 'reclaimed', (tonumber(raws[1]) or 0) + count)
  end
  if part_freed > 0 then F.set_pused(math.max(0, pused - part_freed)) end
  for part, units in pairs(parts) do F.part_changed(part, units) end
  local fields = {...}
  for i = 1, #fields do
    local f = fields[i]
    if gone[f] then
      vals[i + 7] = false
    elseif string.sub(f, 1, 2) == 'p:' and parts[string.sub(f, 3)] then
      vals[i + 7] = redis.call('HGET', K_STATE, f)
    end
  end
end

-- Rates (docs/concepts.md, "Rates"): a sliding log of starts, exact to the server's ms.  A
-- window {count, period} admits a start of weight w at `now` when the starts (weights) in
-- (now - period, now] plus w are at most count.
--
-- A spaced window also spaces the starts evenly (GCRA with no burst tolerance): after a start
-- of weight w, the next one is due w * interval later (interval = period / count; with several
-- spaced windows the longest).  The last start's score is its due time D (fractional), so the
-- next is due at D + w * interval; a start is allowed from floor(that) on, and its own due time
-- is then that (when it is less than 1 ms ahead of now, carrying the fraction: the long-run rate
-- is exact) or now (after an idle gap: no catch-up burst).  So on the server's clock two starts
-- are never closer than w * interval - 1 ms.  The floor of a score is its start's server ms,
-- which is what the windows count (see rate_used()).

-- The weight started in the last `p` ms.  A start counts at its server ms, the floor of its
-- score (a due time is fractional): it is in the window when that is > now - p.
function F.rate_used(p)
  local first = redis.call('ZRANGEBYSCORE', K_RATE, now - p + 1, '+inf', 'LIMIT', 0, 1)
  if not first[1] then return 0 end
  local total, w = string.match(first[1], '^(%d+) (%d+)$')
  return rate_total - (tonumber(total) - tonumber(w))
end

-- Milliseconds until the spacing lets the next start in (0: now, or no spaced window).
function F.space_wait()
  if not rate or not rate.space or rate_last_w == 0 then return 0 end
  return math.max(0, math.floor(rate_last + rate_last_w * rate.space) - now)
end

-- How much weight may start now: the least room left in any window (math.huge: no rate); 0
-- while the spacing holds the next start (when it does not, only one start may be made now:
-- see serve() in entitled()).
function F.rate_budget()
  if not rate then return math.huge end
  if rate.space and F.space_wait() > 0 then return 0 end
  local budget = math.huge
  for _, win in ipairs(rate.windows) do
    local room = win[1] - F.rate_used(win[2])
    if room < budget then budget = room end
  end
  return budget
end

-- Milliseconds until every window has room for `w` more and the spacing lets it in (0: now;
-- -1: never, w is over a window's count).  Per full window: a binary search over the starts in
-- it (log2 of their number ZRANGE calls) for the start whose leaving makes room.
function F.rate_wait(w)
  if not rate then return 0 end
  local wait = F.space_wait()
  for _, win in ipairs(rate.windows) do
    local n, p = win[1], win[2]
    if w > n then return -1 end
    if F.rate_used(p) + w > n then
      -- the first start whose running total reaches `target` leaves at its time + p
      local target = rate_total - n + w
      local lo = redis.call('ZCOUNT', K_RATE, '-inf', '(' .. (now - p + 1))
      local hi = redis.call('ZCARD', K_RATE) - 1
      while lo < hi do
        local mid = math.floor((lo + hi) / 2)
        local member = redis.call('ZRANGE', K_RATE, mid, mid)[1]
        if tonumber(string.match(member, '^(%d+)')) >= target then hi = mid else lo = mid + 1 end
      end
      local found = redis.call('ZRANGE', K_RATE, lo, lo, 'WITHSCORES')
      local opens = math.floor(tonumber(found[2])) + p - now  -- (see rate_used())
      if opens > wait then wait = opens end
    end
  end
  return wait
end

-- Count a start of `w` units against the rate (every grant calls it).
function F.rate_record(w)
  rate_total = rate_total + w
  local t = math.max(now, rate_last)  -- scores never go back: the log stays in start order
  if rate.space and rate_last_w > 0 then
    -- a spaced start is due at the last one's due time + its weight's intervals: keep that
    -- (the fraction of a ms) when it is due within this ms
    local due = rate_last + rate_last_w * rate.space
    if due > t and due < now + 1 then t = due end
  end
  rate_last, rate_last_w = t, w
  redis.call('ZADD', K_RATE, string.format('%.17g', t),
    string.format('%017d', rate_total) .. ' ' .. string.format('%d', w))
  redis.call('ZREMRANGEBYSCORE', K_RATE, '-inf', t - rate.max_p)
  redis.call('PEXPIRE', K_RATE, rate.max_p + 1000)
end

-- How many units may be held now under `limit` (the limit in force): the adaptive limit when
-- it is lower.
function F.adaptive_cap(limit)
  if aimd and aimd.cwnd > 0 and aimd.cwnd < limit then return aimd.cwnd end
  return limit
end

-- Milliseconds until the throttle pause ends (0: no pause).
function F.pause_left()
  if aimd and aimd.pause > now then return aimd.pause - now end
  return 0
end

-- Write the adaptive state back (the field goes once nothing is lowered, paused or
-- remembered).
function F.store_aimd()
  local a = aimd
  if not a then return end
  if a.cwnd == 0 and a.pause <= now and a.till <= now then
    redis.call('HDEL', K_STATE, 'aimd')
    aimd = false
    return
  end
  redis.call('HSET', K_STATE, 'aimd', string.format('%d %d %d %d %d', a.cwnd, a.acc, a.fence,
    a.till, a.pause))
end

-- Additive increase: a successful release of `weight` units of a permit with fencing token
-- `fence`, under `limit` (the limit in force).  Only permits granted after the last decrease
-- count (those granted before it ran under the old limit: their end says nothing about the
-- new one, and a throttled one was granted before the decrease it caused or ignored).  cwnd
-- grows by 1 each time cwnd units have been released this way (TCP's congestion avoidance:
-- about +1 per round of the limit), and the lowered limit is forgotten once it reaches
-- `limit`.
function F.aimd_success(weight, fence, limit)
  local a = aimd
  if not a or a.cwnd == 0 or fence <= a.fence then return end
  local acc, cwnd = a.acc + weight, a.cwnd
  for _ = 1, 64 do  -- bounded: a heavy release may raise it by several, rarely by more
    if acc < cwnd or cwnd >= limit then break end
    acc = acc - cwnd
    cwnd = cwnd + 1
  end
  if cwnd >= limit then cwnd, acc = 0, 0 end
  a.cwnd, a.acc = cwnd, acc
  F.store_aimd()
end

-- Forget that `token` was released (its tombstone, and one set aside by a grant): a new
-- execution of the ticket starts, and its later copies must not be taken for the old one's.
-- Only for a token that is not held (its 'h:' member is then a tombstone, if anything).
function F.forget_done(token)
  redis.call('ZREM', K_EXP, 'h:' .. token, 'd:' .. token)
end

-- Remove the waiter `ticket` (its parsed state field: `info`) from the line.
function F.drop_waiter(ticket, info)
  waiting = waiting - redis.call('ZREM', K_LINE, F.line_member(info.p, info.seq, ticket))
  redis.call('ZREM', K_EXP, 'w:' .. ticket)
  redis.call('HDEL', K_STATE, 'w:' .. ticket)
  F.part_changed(info.p, 0)
end

function F.store_record(part, part_raw, record)
  if not record then return end
  local wanted = record[1] .. ' ' .. record[2] .. ' ' .. record[3]
  if part_raw ~= wanted then redis.call('HSET', K_STATE, 'p:' .. part, wanted) end
end

-- Put `ticket` in line (info: its parsed waiter field when it has a place already, else
-- false), or update its place (which keeps its order, so its priority); returns its waiter
-- info.  `order`: the order text of a new place (see new_order()), false: priority 0.
function F.enqueue(ticket, info, weight, epoch, owner, data, grace, part, order)
  local moved_from = false
  if info then
    -- a changed waiter is named again in a later wake-up (with its new data), unless it was
    -- named just now: then this call is it coming for its units
    if (info.d ~= data or info.e ~= epoch) and now - info.wk >= info.g then info.wk = 0 end
    if info.p ~= part then  -- the ticket comes back in another partition: same arrival number
      redis.call('ZREM', K_LINE, F.line_member(info.p, info.seq, ticket))
      redis.call('ZADD', K_LINE, 0, F.line_member(part, info.seq, ticket))
      moved_from = info.p
    end
    info.w, info.e, info.o, info.d, info.g, info.p = weight, epoch, owner, data, grace, part
  else
    local seq = order or F.new_order(0, 0)
    info = {w = weight, since = now_text, e = epoch, o = owner, d = data, wk = 0, g = grace,
            seq = seq, p = part}
    redis.call('ZADD', K_LINE, 0, F.line_member(part, seq, ticket))
    waiting = waiting + 1
  end
  redis.call('HSET', K_STATE, 'w:' .. ticket, F.encode_waiter(info))
  if moved_from then F.part_changed(moved_from, 0) end
  return info
end

-- The waiter's position in its partition's line (0: the head).
function F.position(ticket, info)
  return redis.call('ZLEXCOUNT', K_LINE, '[' .. F.part_prefix(info.p),
    '(' .. F.line_member(info.p, info.seq, ticket))
end

-- The waiters that the free units belong to, in the order they are served.
--
-- Waiters named in a wake-up less than their wake grace ago come first (each keeps the units it
-- was named for).  Then the rule (docs/concepts.md, "Fair sharing"): among the partitions with
-- waiters, the next
-- units go to the one furthest below its fair share: the lowest used_p / weight_p (units it
-- holds, counting those handed out in this very computation, per unit of partition weight;
-- that is used_p / share_p with share_p = limit * weight_p / sum of the weights, the same
-- order), ties to the partition whose head arrived first.  That partition's head waiter:
--   * is skipped when it can never fit (heavier than the limit or the partition's cap; its own
--     next attempt reports the error);
--   * when the partition's cap leaves no room for it, the partition is served no more now;
--   * when it does not fit in the free units: if it has waited at least `aging` ms since it
--     joined the line, the free units are reserved for it and nobody else is served (they
--     collect until it fits); otherwise its partition is served no more now and the others go
--     on (work-conserving: they may use units this heavy head cannot);
--   * else it is served, and the choice is made again.
-- Within a partition the line is in order (arrival, moved earlier by priority: see KEYS[3]).  With one partition this is the plain FIFO line.
-- Returns a list of {ticket, info-table}.
--
-- Cost: one ZRANGEBYLEX per partition with waiters and per 16 waiters looked at beyond the
-- first batch (as many as the free units, at most 16), and one HMGET per batch looked at.
function F.entitled(limit, aging)
  local out = {}
  -- an adaptive limit lowers the units that may be held; a waiter heavier than it (not than
  -- `limit`) may still start alone, when nothing is held (else it could never start)
  local free = F.adaptive_cap(limit) - used
  local alone = used == 0 and free < limit
  rate_blocked = false
  if waiting <= 0 or free <= 0 then return out end
  if aimd and F.pause_left() > 0 then
    -- a throttle pause: nobody starts; the heads learn when it ends (see name_heads())
    rate_blocked = true
    return out
  end
  -- with a rate, a second budget: the weight that may start now (see rate_budget())
  local rate_free = rate and F.rate_budget() or math.huge
  if rate_free <= 0 then
    rate_blocked = true
    return out
  end
  -- the partitions with waiters, each with its first batch of line members: no more than the
  -- free units (and starts) can serve (each waiter takes at least one), so the usual release,
  -- one unit free, reads and parses one waiter, not 16; head() reads on when that was not
  -- enough
  local first = math.min(16, free, rate_free)
  local parts, fields = {}, {}
  local from = '-'
  while true do
    local batch = redis.call('ZRANGEBYLEX', K_LINE, from, '+', 'LIMIT', 0, first)
    local last
    for _, member in ipairs(batch) do
      local part, seq, ticket, pre = F.split_member(member)
      if not last or last.pre ~= pre then
        last = {name = part, pre = pre, members = {}, at = 1, done = false}
        parts[#parts + 1] = last
        fields[#fields + 1] = 'p:' .. part
      end
      last.members[#last.members + 1] = {seq, ticket}
      last.tail = member
    end
    if #batch < first then break end
    last.more = true  -- it may have more members than this batch holds
    from = '(' .. last.pre .. '\255'
  end
  if #parts == 0 then return out end
  local records = redis.call('HMGET', K_STATE, unpack(fields))
  for i, p in ipairs(parts) do
    local u, c, w = F.parse_part(records[i])
    if p.name == '' then u = used - pused end
    p.used, p.cap, p.w = u, c, w
  end

  -- the head waiter of a partition: {seq, ticket, info}, false when it has no more
  local function head(p)
    local members = p.members
    if p.at > #members then
      if not p.more then return false end
      members = {}
      local batch = redis.call('ZRANGEBYLEX', K_LINE, '(' .. p.tail, '(' .. p.pre .. '\255',
        'LIMIT', 0, 16)
      for _, member in ipairs(batch) do
        local _, seq, ticket = F.split_member(member)
        members[#members + 1] = {seq, ticket}
        p.tail = member
      end
      p.members, p.at, p.more = members, 1, #batch == 16
      if #members == 0 then return false end
    end
    local entry = members[p.at]
    if entry[3] == nil then  -- load the waiter fields of this batch, from here on
      local wanted = {}
      for i = p.at, #members do wanted[#wanted + 1] = 'w:' .. members[i][2] end
      local raws = redis.call('HMGET', K_STATE, unpack(wanted))
      for i = p.at, #members do
        local raw = raws[i - p.at + 1]
        members[i][3] = raw and F.parse_waiter(raw) or false
      end
    end
    return entry
  end

  -- the head waiter of a partition, passing over line members without a field (cannot happen)
  -- and waiters that are not ready (they keep their places, and are served once ready)
  local function live_head(p)
    local h = head(p)
    while h and not (h[3] and F.ready(h[3])) do
      p.at = p.at + 1
      h = head(p)
    end
    return h
  end

  local function serve(p, h)
    out[#out + 1] = {h[2], h[3]}
    alone = false
    free = free - h[3].w
    rate_free = rate_free - h[3].w
    if rate and rate.space then rate_free = 0 end  -- spaced: one start at a time
    p.used = p.used + h[3].w
    p.at = p.at + 1
  end

  -- First, waiters named in a wake-up less than their wake grace ago keep the units they were
  -- named for: they are on their way, and a newcomer in another partition does not take those
  -- units back.  (They stand at the front of their lines: they were entitled when named.)
  local never = rate and rate.min_n or math.huge  -- heavier than a rate window's count
  for _, p in ipairs(parts) do
    while free > 0 and rate_free > 0 do
      local h = live_head(p)
      if not h then break end
      local info = h[3]
      local w = info.w
      if w > limit or (p.cap and w > p.cap) or w > never then
        p.at = p.at + 1  -- can never fit
      elseif info.wk == 0 or now - info.wk >= info.g or (w > free and not alone)
          or w > rate_free or (p.cap and p.used + w > p.cap) then
        break
      else
        serve(p, h)
      end
    end
  end

  -- Then the fair-share order.
  while free > 0 and rate_free > 0 do
    local best, best_head
    for _, p in ipairs(parts) do
      if not p.done then
        local h = live_head(p)
        if not h then
          p.done = true
        elseif not best then
          best, best_head = p, h
        else
          local x, y = p.used * best.w, best.used * p.w
          if x < y or (x == y and h[1] < best_head[1]) then best, best_head = p, h end  -- (orders: text)
        end
      end
    end
    if not best then break end
    local info = best_head[3]
    local w = info.w
    if w > limit or (best.cap and w > best.cap) or w > never then
      best.at = best.at + 1  -- can never fit
    elseif best.cap and best.used + w > best.cap then
      best.done = true
    elseif (w > free and not alone) or w > rate_free then
      if now - tonumber(info.since) >= aging then break end
      best.done = true
    else
      serve(best, best_head)
    end
  end
  -- the rate left units free that waiters could have used (an estimate: see name_heads())
  rate_blocked = rate ~= false and free > 0 and rate_free < free and #out < waiting
  return out
end

-- With a rate: the head waiter of each partition (at most 16), that is not in `list` (already
-- named) nor `me`, and blocks (no wake data), appended to `reply` as ticket, '' pairs without
-- marking it woken.  When entitled() found the rate, not the units, in the way (rate_blocked),
-- collect_wakes() calls this, so the next heads learn at once when their window opens (their
-- own call returns that: nobody releases when it does) instead of at their next poll.
function F.name_heads(list, me, reply)
  local skip = {[me] = true}
  for _, entry in ipairs(list) do skip[entry[1]] = true end
  local from = '-'
  for _ = 1, 16 do
    local member = redis.call('ZRANGEBYLEX', K_LINE, from, '+', 'LIMIT', 0, 1)[1]
    if not member then break end
    local _, _, ticket, pre = F.split_member(member)
    if not skip[ticket] then
      local raw = redis.call('HGET', K_STATE, 'w:' .. ticket)
      if raw and F.parse_waiter(raw).d == '' then
        reply[#reply + 1] = ticket
        reply[#reply + 1] = ''
      end
    end
    from = '(' .. pre .. '\255'
  end
  return reply
end

-- Of the entitled waiters other than `me`, those to wake now: each is named at most once per
-- `grace` ms, so a burst of calls does not send a burst of wake-ups.  Appends ticket, data
-- pairs to `reply`.
function F.collect_wakes(list, me, grace, reply)
  local marks = {}
  for _, entry in ipairs(list) do
    local ticket, info = entry[1], entry[2]
    local parked = info.d ~= ''
    if ticket ~= me and (CAN_DISPATCH or not parked)
        and (now - (info.wk or 0)) >= (info.g or grace) then
      info.wk = now
      marks[#marks + 1] = 'w:' .. ticket
      marks[#marks + 1] = F.encode_waiter(info)
      reply[#reply + 1] = ticket
      reply[#reply + 1] = info.d
      if #marks >= 512 then  -- one HSET per 256 waiters: unpack() takes only so many values
        redis.call('HSET', K_STATE, unpack(marks))
        marks = {}
      end
    end
  end
  if #marks > 0 then redis.call('HSET', K_STATE, unpack(marks)) end
  if rate_blocked and name_rate_heads and waiting > 0 then F.name_heads(list, me, reply) end
  rate_blocked = false
  return reply
end

end

setmetatable(F, {__index = function(t, name)
  setmetatable(t, nil)
  define_rest()
  return rawget(t, name)
end})

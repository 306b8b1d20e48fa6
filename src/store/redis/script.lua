-- tollgate: one key's windows, queue and calls in flight, checked and changed all or nothing,
-- in one round trip. A port of the rule book in src/bucket/ (state.rs with state/admission.rs
-- and state/ledger.rs, queue.rs, flights.rs), function for function;
-- tests/redis/differential.rs runs both on the same random sequences and compares every
-- answer. Where the two must differ it says so here, and why.
--
-- The constants in double braces are filled in from the Rust constants when the script is
-- loaded (src/store/redis/script.rs), never copied by hand.
--
-- KEYS[1]  the key's hash: levels, times, the shadow schedule, the tickets' and flights' data
-- KEYS[2]  the key's queue: a sorted set of ticket ids (16 digits, zero-padded, so that
--          equal scores keep the order of issue), scored by their tags: in fair order
-- KEYS[3]  the tenants with tickets waiting (a hash: tenant -> "tag waiting", the tag of its
--          last ticket and how many of its tickets wait)
-- ARGV[1]  operation: acquire, admit, cancel, adjust, penalize, lower, sync, settle,
--          snapshot or ping
-- ARGV[2]  the limits' canonical text: a key holding other limits is refused
-- ARGV[3]  the time in milliseconds, or "" for the server's TIME (tests pass explicit times)
-- ARGV[4]  the number of windows k (1 to 32)
-- ARGV[5]  the lease of a ticket in milliseconds: how long past its due time it is kept
--          without its holder asking for it
-- then for each window, four integers: its currency (1 requests, 2 tokens, 3 output tokens,
--          4 spend),
--          scale S (units per token), refill n (units per millisecond), capacity C = burst * S
-- then the operation's own arguments:
--   acquire   requests, tokens, output tokens, spend, max wait in ms (-1: none), fly (0 or 1),
--             the fair step (the rule book's queue::fair_step, 1 to 2^53 - 1), the tenant (its
--             id, 16 hexadecimal digits; 0000000000000000 for the key's own calls)
--   admit     ticket id, fly (0 or 1), its due time in ms as issued (-1: not known)
--   cancel    ticket id, its due time in ms as issued (-1: not known)
--   adjust    requests, tokens, output tokens, spend to add (negative: to take)
--   penalize  the pause in milliseconds, the spent currencies (a mask: 1, 2, 4, 8), and the
--             refusal: the provider's pause in ms (-1: none, and nothing follows), the refused
--             call's flight (0: none), what it needed (4) and what went out after it (4)
--   lower     currency, remaining tokens
--   sync      flight, charged (4), remaining (4, -1: not said), elsewhere (4), returnable (4),
--             margin (4), margin only where more is found (4, 0 or 1), refused (0: no; 16 +
--             the mask of the currencies given back), counted after (ms after the call went out)
--             and then, to settle the call as done in the same step: 1, used (4, -1: as charged)
--   settle    flight, charged (4), used (4, -1: as charged), last (0 or 1), counted after
--             (ms after the call went out; 0: not known)
--
-- Per-currency lists have NC = 4 entries, in the order requests, tokens, output tokens, spend.
--
-- Time: the rule book counts nanoseconds, the script milliseconds (the server's TIME,
-- truncated); on whole milliseconds the two agree exactly, and a hint rounded up to the
-- millisecond is the rule book's rounded up. Ticket ids: the rule book's come from its
-- store; here they are the time in ms times 1000 plus a counter, unique across restarts.
--
-- Every quantity is an integer below 2^53, where Lua's doubles are exact: the client refuses
-- limits whose capacity passes 2^46, and this script checks every argument again, answering an
-- error rather than computing with a value out of range. Levels stay between -DEBT C and C.
-- Loops whose length depends on the data walk the key's own queue and calls in flight, both
-- bounded (MAX_QUEUE, MAX_FLIGHTS); no correction loop depends on a value.
--
-- Hash fields: sig (the limits), t (time of the real levels), p (end of a pause), l1..lk (real
-- levels in units), n (the next ticket id), pq1..pq4 (what the tickets will pay, per currency),
-- st and s1..sk (the shadow: the levels once every ticket has paid, as of the last one's due
-- time; absent when it must be rebuilt), ql (the latest lease of any ticket), and for each
-- ticket q<id> = "due lease requests tokens output_tokens spend", with " 1" after it for a
-- ticket issued promised, and pf (tickets up to this id lost their promise). Calls in flight: fn (the
-- next flight's number), ff (the first one remembered), fa (when the last one went out),
-- f<id> = "at charged1..charged4 done level1..level4 corrected1..corrected4", c1..c4 (the
-- cover), cv (the last call it covers) and k1..k4 (the tokens corrected for spending elsewhere
-- so far). Records written before spend was a currency (three per currency) read with a spend
-- of 0.
--
-- Replies: {"ok", now} | {"flying", id, now} | {"queued", id, due_in, now} |
--          {"wait", ms, now} | {"behind", ms, now} | {"lost", now} | {"done", now} |
--          {"full", now} | {"lowered", above, now} | {"emptied", e1..e4, now} |
--          {"synced", above (4), spent (4) ("" when not read), ambiguous, since, lowered (4),
--           returned (4), now} |
--          {"settled", d1..d4, now} | {"levels", now, l1, ..} | {"conflict", sig}

local hash = KEYS[1]
local queue = KEYS[2]
local tenants = KEYS[3]
local MAX = 9007199254740991 -- 2^53 - 1
local MAX_CAP = {{MAX_CAPACITY}}
local DEBT = {{DEBT_BURSTS}}
local MAX_QUEUE = {{MAX_QUEUE}}
local SCAN_AHEAD = {{SCAN_AHEAD}}
local MAX_FLIGHTS = {{MAX_FLIGHTS}}
local FLIGHT_LEASE = {{FLIGHT_LEASE_MS}}
local SKEW = {{SEND_SKEW_MS}}
local NC = 4
-- A key expires on the server's clock. Given an explicit time (tests do), the key lives on the
-- caller's clock, which the server's can't measure: it is kept (a key past its expiry is a full
-- one, so keeping it changes no decision; expiring it on the server's clock while the caller's
-- has barely moved would empty it of what it still holds).
local REAL_CLOCK = ARGV[3] == ''
-- How much longer than it must the fast path keeps a key alive when it renews its expiry, in
-- ms: the calls of that second then need not renew it (a key past its expiry is a full one, so
-- living longer changes no decision).
local EXPIRY_SPARE = 1000
-- The longest a key is kept, in ms (about 35 years): an expiry past it is cut to it, so that
-- no sum of pending charges makes one the server can't read.
local MAX_EXPIRE = 1099511627776

-- The fast path: an acquire that passes at once, on a key where nobody waits, no pause is in
-- force, nothing is pending and no call in flight is remembered, and that is not itself a call
-- to fly. It answers before the rest of the script is set up (that setup, the helpers and the
-- reading of every field, is most of an acquire's time), and only where the full path below
-- would answer the same: 'ok', the same levels, the same time and the same expiry. Anything
-- else (an argument or a stored field the full path would refuse, a conflict, a window that
-- can't pay, a window in debt, something pending, a shadow, a pause, a ledger of calls in
-- flight, a call to fly, more than four windows) makes it answer nil, and the full path
-- decides.
--
-- What it reads instead of the queue: every ticket costs something (a cost of nothing is
-- refused) and is counted in pq1..pq4 while it waits, so a key with nothing pending has nobody
-- waiting; the full path would find no ticket to expire and no shadow to charge. (A queue
-- entry whose ticket record is gone, which only an eviction can leave, changes no decision:
-- the full path drops it unread.) The ledger of calls in flight (fn, ff, fa, cv, c1..c4,
-- k1..k4) is written and deleted as one, so fn alone says whether there is one. The fields it
-- does not write are the ones the full path would write unchanged, or as the value their
-- absence reads as (p and pq1..pq4 as 0); the queue, which holds nobody, needs no expiry.
-- tests/redis/differential.rs checks this path against the rule book on traces through both
-- paths, and that it answers where it should.
local function fast_acquire()
  -- Each integer is checked as int() below checks it, written out where it is used (a call to
  -- a Lua function costs as much as the check).
  local tonumber, floor = tonumber, math.floor
  local v
  local k = tonumber(ARGV[4])
  -- Keys of more than four windows take the full path.
  if not (k and k >= 1 and k <= 4 and k % 1 == 0) then return nil end
  v = tonumber(ARGV[5])
  if not (v and v >= 0 and v <= 4000000000000 and v % 1 == 0) then return nil end
  local a = 5 + k * 4
  -- The cost, per currency (no table: this path counts its allocations).
  local c1, c2, c3, c4 = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]),
    tonumber(ARGV[a + 4])
  if not (c1 and c1 >= 0 and c1 <= MAX and c1 % 1 == 0 and c2 and c2 >= 0 and c2 <= MAX
    and c2 % 1 == 0 and c3 and c3 >= 0 and c3 <= MAX and c3 % 1 == 0 and c4 and c4 >= 0
    and c4 <= MAX and c4 % 1 == 0) or c1 + c2 + c3 + c4 == 0 then
    return nil
  end
  -- The wait allowed (unused: a call that passes at once waits for nothing, but an argument
  -- the full path refuses is refused), and whether to fly: a call to fly is remembered in the
  -- ledger, the full path's. (Where a check here is stricter than the full path's, as this one
  -- on the text "0", the full path answers instead: never a different answer.)
  v = ARGV[a + NC + 1]
  if v ~= '-1' and v ~= '0' then
    v = tonumber(v)
    if not (v and v >= -1 and v <= MAX and v % 1 == 0) then return nil end
  end
  if ARGV[a + NC + 2] ~= '0' then return nil end
  -- The fair step and the tenant (unused: nobody waits), checked as the full path checks them.
  v = tonumber(ARGV[a + NC + 3])
  if not (v and v >= 1 and v <= MAX and v % 1 == 0) then return nil end
  v = ARGV[a + NC + 4]
  if not (v and #v == 16 and not string.find(v, '%X')) then return nil end
  local got = redis.call('HMGET', KEYS[1], 'sig', 't', 'p', 'st', 'fn', 'pq1', 'pq2', 'pq3',
    'pq4', 'l1', 'l2', 'l3', 'l4', 'x')
  -- A conflict, a shadow (someone waits), or a ledger of calls in flight: the full path's.
  if got[1] and got[1] ~= ARGV[2] or got[4] or got[5] then return nil end
  for j = 6, 9 do
    -- Something pending is the full path's (store() writes an amount of 0 as "0").
    if got[j] and got[j] ~= '0' then return nil end
  end
  local now
  if ARGV[3] ~= '' then
    now = tonumber(ARGV[3])
    if not (now and now >= 0 and now <= 4000000000000000 and now % 1 == 0) then return nil end
  else
    local time = redis.call('TIME')
    now = tonumber(time[1]) * 1000 + floor(tonumber(time[2]) / 1000)
  end
  local last = now
  if got[2] then
    last = tonumber(got[2])
    if not (last and last >= 0 and last <= 4000000000000000 and last % 1 == 0) then
      return nil
    end
    if now < last then now = last end
  end
  local paused_until = 0
  if got[3] and got[3] ~= '0' then
    paused_until = tonumber(got[3])
    if not (paused_until and paused_until >= 0 and paused_until <= MAX
      and paused_until % 1 == 0 and paused_until <= now) then
      return nil
    end
  end
  local elapsed = now - last
  -- The key lives until its windows would be full again, as store() below says.
  local expire_ms = paused_until - now
  local lv = {}
  for i = 1, k do
    local b = 1 + i * 4
    local cur, scale, rate, cap = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]),
      tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
    if not (cur and cur >= 1 and cur <= NC and cur % 1 == 0
      and scale and scale >= 1 and scale <= MAX_CAP and scale % 1 == 0
      and rate and rate >= 1 and rate <= MAX_CAP and rate % 1 == 0
      and cap and cap >= 1 and cap <= MAX_CAP and cap % 1 == 0
      and cap % scale == 0) then
      return nil
    end
    local needed = scale * (cur == 1 and c1 or cur == 2 and c2 or cur == 3 and c3 or c4)
    if needed > cap then return nil end
    local level = cap
    if got[9 + i] then
      level = tonumber(got[9 + i])
      if not (level and level >= -DEBT * cap and level <= cap and level % 1 == 0) then
        return nil
      end
    end
    -- Refilled and saturated, as refill() below; then charged, as charge() below (a cost within
    -- the burst, on a level that can pay it, needs no clamp).
    local room = cap - level
    if room <= 0 or rate * elapsed >= room then
      level = cap
    else
      level = level + rate * elapsed
    end
    level = level - needed
    if level < 0 then return nil end
    lv[i] = level
    room = cap - level
    if room > 0 then
      -- ceil(room / rate), exact as ceil_div below.
      local q = floor(room / rate)
      if q * rate < room then q = q + 1 end
      if q > 0 and (q - 1) * rate >= room then q = q - 1 end
      if q > expire_ms then expire_ms = q end
    end
  end
  -- Numbers passed to a command are written as %.17g writes them: every integer below 2^53
  -- in full, as fmt() below writes it (and sooner than string.format).
  if k == 1 then
    redis.call('HSET', KEYS[1], 'sig', ARGV[2], 't', now, 'l1', lv[1])
  elseif k == 2 then
    redis.call('HSET', KEYS[1], 'sig', ARGV[2], 't', now, 'l1', lv[1], 'l2', lv[2])
  elseif k == 3 then
    redis.call('HSET', KEYS[1], 'sig', ARGV[2], 't', now, 'l1', lv[1], 'l2', lv[2], 'l3', lv[3])
  else
    redis.call('HSET', KEYS[1], 'sig', ARGV[2], 't', now, 'l1', lv[1], 'l2', lv[2], 'l3', lv[3],
      'l4', lv[4])
  end
  -- The key must live at least until then: renewed only when it would not (`x`, when it
  -- expires, as last set), with a second to spare, so that the calls of the next second need
  -- not renew it. (Living a little longer changes nothing: a key past its expiry is a full one.)
  if REAL_CLOCK then
    local x = tonumber(got[14] or 0)
    if not x or now + expire_ms + 1 > x then
      local ttl = expire_ms + 1 + EXPIRY_SPARE
      redis.call('PEXPIRE', KEYS[1], ttl)
      redis.call('HSET', KEYS[1], 'x', now + ttl)
    end
  end
  return {'ok', now, 'fast'}
end

-- The fast path of an admission: the holder of the ticket first in line asks, not to fly, on a
-- key with no pause in force and no ledger of calls in flight. Nothing is ahead of it, so
-- the full path would look at no other ticket: it passes if every window can pay (charged,
-- its ticket forgotten), else it hears exactly when it can (its lease renewed past then). As
-- for the acquire above, anything else (an argument or a field the full path would refuse, a
-- ticket gone, lapsed or not first, a pause, a ledger, a call to fly, more than four windows)
-- answers nil and the full path decides.
local function fast_admit()
  local tonumber = tonumber
  local v
  local k = tonumber(ARGV[4])
  if not (k and k >= 1 and k <= 4 and k % 1 == 0) then return nil end
  local lease = tonumber(ARGV[5])
  if not (lease and lease >= 0 and lease <= 4000000000000 and lease % 1 == 0) then
    return nil
  end
  local a = 5 + k * 4
  -- The ticket's number as the full path writes it (digits only), and not to fly.
  local idtext = ARGV[a + 1]
  if ARGV[a + 2] ~= '0' or not string.find(idtext, '^[1-9]%d*$') then return nil end
  v = tonumber(idtext)
  if not (v and v <= MAX) then return nil end
  idtext = string.format('%016.0f', v)
  -- When the holder was told it is due: checked as the full path checks it, unused (a ticket
  -- this path answers is in the queue, and not promised: its record has no seventh field).
  v = tonumber(ARGV[a + 3])
  if not (v and v >= -1 and v <= MAX and v % 1 == 0) then return nil end
  local got = redis.call('HMGET', KEYS[1], 'sig', 't', 'p', 'fn', 'pq1', 'pq2', 'pq3', 'pq4',
    'l1', 'l2', 'l3', 'l4', 'q' .. idtext, 'ql')
  if got[1] and got[1] ~= ARGV[2] or got[4] or not got[13] then return nil end
  -- The ticket: "due lease requests tokens output_tokens spend", and its tenant (" ~" and 16
  -- hexadecimal digits), as encode_ticket() writes it.
  local due, until_ms, c1, c2, c3, c4, rest = string.match(got[13],
    '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+)(.*)$')
  if not c4 then return nil end
  local tenant = nil
  if rest ~= '' then
    tenant = string.match(rest, '^ ~(%x+)$')
    if not tenant then return nil end
  end
  until_ms = tonumber(until_ms)
  local cost = {tonumber(c1), tonumber(c2), tonumber(c3), tonumber(c4)}
  local pq = {}
  for c = 1, NC do
    v = got[4 + c]
    if v then
      v = tonumber(v)
      if not (v and v >= 0 and v <= MAX and v % 1 == 0) then return nil end
    else
      v = 0
    end
    pq[c] = v
  end
  local now
  if ARGV[3] ~= '' then
    now = tonumber(ARGV[3])
    if not (now and now >= 0 and now <= 4000000000000000 and now % 1 == 0) then return nil end
  else
    local time = redis.call('TIME')
    now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  end
  local last = now
  if got[2] then
    last = tonumber(got[2])
    if not (last and last >= 0 and last <= 4000000000000000 and last % 1 == 0) then
      return nil
    end
    if now < last then now = last end
  end
  local paused_until = 0
  if got[3] and got[3] ~= '0' then
    paused_until = tonumber(got[3])
    if not (paused_until and paused_until >= 0 and paused_until <= MAX
      and paused_until % 1 == 0 and paused_until <= now) then
      return nil
    end
  end
  -- Lapsed (the full path forgets it), or not first in line (the full path looks at those
  -- ahead).
  if until_ms < now then return nil end
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)
  if head[1] ~= idtext then return nil end
  local elapsed = now - last
  local lv, rates, caps, wait = {}, {}, {}, 0
  local curs, scales = {}, {}
  for i = 1, k do
    local b = 1 + i * 4
    local cur, scale, rate, cap = tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2]),
      tonumber(ARGV[b + 3]), tonumber(ARGV[b + 4])
    if not (cur and cur >= 1 and cur <= NC and cur % 1 == 0
      and scale and scale >= 1 and scale <= MAX_CAP and scale % 1 == 0
      and rate and rate >= 1 and rate <= MAX_CAP and rate % 1 == 0
      and cap and cap >= 1 and cap <= MAX_CAP and cap % 1 == 0
      and cap % scale == 0 and cost[cur] * scale <= cap) then
      return nil
    end
    local level = cap
    if got[8 + i] then
      level = tonumber(got[8 + i])
      if not (level and level >= -DEBT * cap and level <= cap and level % 1 == 0) then
        return nil
      end
    end
    -- Refilled, as refill() below; what it lacks for the ticket, as wait_for() below (a cost
    -- within the burst needs no cap).
    local room = cap - level
    if room <= 0 or rate * elapsed >= room then
      level = cap
    else
      level = level + rate * elapsed
    end
    local needed = cost[cur] * scale
    if level < needed then
      local q = math.floor((needed - level) / rate)
      if q * rate < needed - level then q = q + 1 end
      if q > 0 and (q - 1) * rate >= needed - level then q = q - 1 end
      if q > wait then wait = q end
    end
    lv[i], rates[i], caps[i] = level, rate, cap
    curs[i], scales[i] = cur, scale
    lv[k + i] = needed
  end
  local reply
  if wait == 0 then
    -- It passes: charged (as charge() below: within the burst, on levels that can pay), and
    -- forgotten (as forget_ticket() below).
    for i = 1, k do lv[i] = lv[i] - lv[k + i] end
    redis.call('ZREM', KEYS[2], idtext)
    redis.call('HDEL', KEYS[1], 'q' .. idtext)
    -- Its tenant has one ticket fewer waiting (as tenant_left() below).
    if tenant then
      local entry = redis.call('HGET', KEYS[3], tenant)
      local tag, waiting = string.match(entry or '', '^(%d+) ?(%d*)$')
      waiting = tonumber(waiting) or 0
      if waiting <= 1 then
        redis.call('HDEL', KEYS[3], tenant)
      else
        redis.call('HSET', KEYS[3], tenant, tag .. ' ' .. string.format('%.0f', waiting - 1))
      end
    end
    for c = 1, NC do
      pq[c] = pq[c] - cost[c]
      if pq[c] < 0 then pq[c] = 0 end
    end
    reply = {'ok', now, 'fast'}
  else
    -- Not yet: its lease runs past when it can pass, as the full path renews it.
    local ready = now + wait
    if ready + lease > until_ms then
      redis.call('HSET', KEYS[1], 'q' .. idtext, string.format('%s %.0f %s %s %s %s', due,
        ready + lease, c1, c2, c3, c4) .. rest)
      local ql = tonumber(got[14] or 0)
      if ready + lease > ql then
        got[14] = ready + lease
        redis.call('HSET', KEYS[1], 'ql', string.format('%.0f', ready + lease))
      end
    end
    reply = {'wait', wait, now, 'fast'}
  end
  -- Written back as store() below writes them, and the same expiry.
  local out = {'sig', ARGV[2], 't', now, 'p', paused_until, 'pq1', pq[1], 'pq2', pq[2], 'pq3',
    pq[3], 'pq4', pq[4]}
  local expire_ms = paused_until - now
  for i = 1, k do
    out[#out + 1] = 'l' .. i
    out[#out + 1] = lv[i]
    local room = caps[i] - lv[i]
    if room > 0 then
      local q = math.floor(room / rates[i])
      if q * rates[i] < room then q = q + 1 end
      if q > 0 and (q - 1) * rates[i] >= room then q = q - 1 end
      if q > expire_ms then expire_ms = q end
    end
  end
  redis.call('HSET', KEYS[1], unpack(out))
  local queued = redis.call('ZCARD', KEYS[2])
  if queued == 0 then
    redis.call('HDEL', KEYS[1], 'st')
  else
    -- Until a burst's refill past the last lease of a ticket waiting (as store() below).
    local ql = tonumber(got[14] or 0)
    local burst = 0
    for i = 1, k do
      local q = math.floor(caps[i] / rates[i])
      if q * rates[i] < caps[i] then q = q + 1 end
      if q > burst then burst = q end
    end
    if ql - now + burst > expire_ms then expire_ms = ql - now + burst end
  end
  if expire_ms > MAX_EXPIRE then expire_ms = MAX_EXPIRE end
  if REAL_CLOCK then
    redis.call('PEXPIRE', KEYS[1], expire_ms + 1)
    redis.call('HSET', KEYS[1], 'x', now + expire_ms + 1)
    redis.call('PEXPIRE', KEYS[2], expire_ms + 1)
    if queued > 0 then redis.call('PEXPIRE', KEYS[3], expire_ms + 1) end
  end
  return reply
end

if ARGV[1] == 'acquire' then
  local answered = fast_acquire()
  if answered then return answered end
elseif ARGV[1] == 'admit' then
  local answered = fast_admit()
  if answered then return answered end
end

-- A fresh list of NC zeros.
local function zeros()
  local z = {}
  for c = 1, NC do z[c] = 0 end
  return z
end

-- A copy of a per-currency list.
local function copy(list)
  local out = {}
  for c = 1, NC do out[c] = list[c] end
  return out
end

local function fail(what)
  return redis.error_reply('ERR tollgate: ' .. what)
end

-- An integer argument in [lo, hi], or nil.
local function int(text, lo, hi)
  local v = tonumber(text)
  if v == nil or v ~= v or v ~= math.floor(v) or v < lo or v > hi then
    return nil
  end
  return v
end

local function fmt(v)
  return string.format('%.0f', v)
end

-- A ticket's id as its queue entry and record name say it: 16 digits, zero-padded (every id is
-- below 2^53 < 10^16), so that the sorted set orders equal tags by id.
local function ticket_text(id)
  return string.format('%016.0f', id)
end


local op = ARGV[1]
local sig = ARGV[2]
local k = int(ARGV[4], 1, 32)
local lease = int(ARGV[5], 0, 4000000000000)
if k == nil or lease == nil then
  return fail('bad window count or lease')
end

local w = {}
local has = {false, false, false, false}
for i = 1, k do
  local b = 5 + (i - 1) * 4
  local cur = int(ARGV[b + 1], 1, NC)
  local scale = int(ARGV[b + 2], 1, MAX_CAP)
  local rate = int(ARGV[b + 3], 1, MAX_CAP)
  local cap = int(ARGV[b + 4], 1, MAX_CAP)
  if cur == nil or scale == nil or rate == nil or cap == nil or cap % scale ~= 0 then
    return fail('bad parameters for window ' .. i)
  end
  w[i] = {cur = cur, scale = scale, rate = rate, cap = cap, burst = cap / scale}
  has[cur] = true
end
local args = 5 + k * 4
-- The tightest window of each currency (the smallest burst, the first of equals): the one a
-- provider's count of that currency speaks of.
local tightest = {}
for i = 1, k do
  local c = w[i].cur
  if tightest[c] == nil or w[i].burst < w[tightest[c]].burst then tightest[c] = i end
end

-- The key's fields, read in one call.
local names = {'sig', 't', 'p', 'fn', 'ff', 'cv', 'pf'}
for c = 1, NC do
  names[#names + 1] = 'pq' .. c
  names[#names + 1] = 'c' .. c
  names[#names + 1] = 'k' .. c
end
for i = 1, k do names[#names + 1] = 'l' .. i end
local read = redis.call('HMGET', hash, unpack(names))
local fields = {}
for j = 1, #names do fields[names[j]] = read[j] end

local stored = fields['sig']
if stored and stored ~= sig then
  return {'conflict', stored}
end

local now
if ARGV[3] ~= '' then
  now = int(ARGV[3], 0, 4000000000000000)
  if now == nil then
    return fail('bad time')
  end
else
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

-- A field read back as an integer in range, or the default when absent. A value out of range
-- (written by something else) is an error, never a reason to loop or overflow.
local bad_field = nil
local function field(name, lo, hi, default)
  local v = fields[name]
  if v == nil then v = redis.call('HGET', hash, name) end
  if not v then
    return default
  end
  v = int(v, lo, hi)
  if v == nil then
    bad_field = name
    return default
  end
  return v
end

local last = field('t', 0, 4000000000000000, now)
-- One clock, but a late writer may still carry an older reading: time never runs backwards.
if now < last then
  now = last
end
local paused_until = field('p', 0, MAX, 0)
local levels = {}
for i = 1, k do
  levels[i] = field('l' .. i, -DEBT * w[i].cap, w[i].cap, w[i].cap)
end
local pq = {}
for c = 1, NC do pq[c] = field('pq' .. c, 0, MAX, 0) end
-- Calls in flight: the numbers ff .. fn - 1 are remembered (none when ff = fn).
local fnext = field('fn', 1, MAX, 1)
local ffirst = field('ff', 1, MAX, fnext)
local cover, corrected = {}, {}
for c = 1, NC do
  cover[c] = field('c' .. c, 0, MAX, 0)
  corrected[c] = field('k' .. c, -MAX, MAX, 0)
end
local covers = field('cv', 0, MAX, 0)
-- Tickets up to this id lost their promise (the rule book's Queue::floor).
local floor_id = field('pf', 0, MAX, 0)
if bad_field then
  return fail('the stored field ' .. bad_field .. ' is out of range')
end
if ffirst > fnext then
  return fail('the stored calls in flight are out of order')
end

-- ceil(a / b) for integers 0 <= a < 2^52 and 0 < b < 2^47: the quotient of the doubles is
-- within one of the true one, so one correction each way is exact.
local function ceil_div(a, b)
  local q = math.floor(a / b)
  if q * b < a then q = q + 1 end
  if q > 0 and (q - 1) * b >= a then q = q - 1 end
  return q
end

-- floor(a / b) for integers 0 <= a < 2^53 and 0 < b < 2^47, corrected like ceil_div.
local function floor_div(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 end
  if (q + 1) * b <= a then q = q + 1 end
  return q
end

-- Whole tokens in `units` of window i, rounded down (negative too).
local function whole(i, units)
  if units >= 0 then return floor_div(units, w[i].scale) end
  return -ceil_div(-units, w[i].scale)
end

-- The level `elapsed` ms after `level`, refilled and saturated.
local function refill(i, level, elapsed)
  local room = w[i].cap - level
  if room <= 0 then return w[i].cap end
  -- rate * elapsed is exact while below 2^53; above, it is certainly more than the room.
  local gain = w[i].rate * elapsed
  if gain >= room then return w[i].cap end
  return level + gain
end

-- Units of `amount` of window i's currency, capped where the cap already decides.
local function units(i, amount)
  local limit = (DEBT + 2) * w[i].burst
  if amount > limit then amount = limit end
  return amount * w[i].scale
end

-- Milliseconds until level reaches `needed` units.
local function wait_for(i, level, needed)
  if level >= needed then return 0 end
  return ceil_div(needed - level, w[i].rate)
end

local function clamp(i, level)
  if level > w[i].cap then return w[i].cap end
  if level < -DEBT * w[i].cap then return -DEBT * w[i].cap end
  return level
end


-- The longest wait of all windows for `cost` (per currency) on top of `ahead`.
local function wait_all(lv, ahead, cost)
  local longest = 0
  for i = 1, k do
    local c = w[i].cur
    local t = wait_for(i, lv[i] - units(i, ahead[c]), units(i, cost[c]))
    if t > longest then longest = t end
  end
  return longest
end

local function charge(lv, cost)
  for i = 1, k do
    lv[i] = clamp(i, lv[i] - units(i, cost[w[i].cur]))
  end
end

-- Adds `delta` tokens per currency to the levels `lv` (a refund never above capacity, a charge
-- never below the floor).
local function add_to(lv, delta)
  for i = 1, k do
    local d = delta[w[i].cur]
    local limit = (DEBT + 2) * w[i].burst
    if d > limit then d = limit end
    if d < -limit then d = -limit end
    lv[i] = clamp(i, lv[i] + d * w[i].scale)
  end
end

local function decode_ticket(id, data)
  if not data then return nil end
  -- A record as encode_ticket() writes it, in one match (a queue's records are read by the
  -- dozen: a ticket asking reads up to SCAN_AHEAD, a new plan all of them).
  -- A seventh field, 1, marks a ticket issued promised (the rule book's Place::promise); a
  -- last one, ~ and 16 hexadecimal digits, names its tenant (Place::tenant; records written
  -- before fair share have none).
  local due, until_ms, c1, c2, c3, c4, mark, tenant = string.match(data,
    '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+) ?(%d*) ?~?(%x*)$')
  if c4 then
    return {id = id, due = tonumber(due), lease = tonumber(until_ms),
      cost = {tonumber(c1), tonumber(c2), tonumber(c3), tonumber(c4)}, promise = mark == '1',
      tenant = tenant}
  end
  local f = {}
  for part in string.gmatch(data, '%S+') do
    f[#f + 1] = tonumber(part)
  end
  return {id = id, due = f[1], lease = f[2], cost = {f[3], f[4], f[5], f[6] or 0},
    promise = f[7] == 1}
end

local function encode_ticket(due, until_ms, cost, promise, tenant)
  local text = string.format(promise and '%.0f %.0f %.0f %.0f %.0f %.0f 1' or
    '%.0f %.0f %.0f %.0f %.0f %.0f', due, until_ms, cost[1], cost[2], cost[3], cost[4])
  if tenant and tenant ~= '' then text = text .. ' ~' .. tenant end
  return text
end

-- A tenant's entry in KEYS[3] (Queue::tenants): "tag waiting", the tag of its last ticket and
-- how many of its tickets wait (an entry written before the count was kept reads as 0 waiting).
local function tenant_entry(tenant)
  local v = redis.call('HGET', tenants, tenant)
  if not v then return 0, 0 end
  local tag, waiting = string.match(v, '^(%d+) ?(%d*)$')
  return tonumber(tag) or 0, tonumber(waiting) or 0
end

-- A ticket of `tenant` left the queue (Queue::left): a tenant with none left waiting is
-- forgotten, so that its next call starts from the head.
local function tenant_left(tenant)
  if tenant == nil or tenant == '' then return end
  local tag, waiting = tenant_entry(tenant)
  if waiting <= 1 then
    redis.call('HDEL', tenants, tenant)
  else
    redis.call('HSET', tenants, tenant, fmt(tag) .. ' ' .. fmt(waiting - 1))
  end
end

-- Whether ticket `t` (decoded) is promised, as Queue::promised.
local function promised(t)
  return t.promise and tonumber(t.id) > floor_id
end

local function parse_ticket(id)
  return decode_ticket(id, redis.call('HGET', hash, 'q' .. id))
end

-- The tickets `ids`, in order, read a thousand to a call; nil for one that is gone.
local function parse_tickets(ids)
  local out = {}
  for from = 1, #ids, 1000 do
    local upto = math.min(#ids, from + 999)
    local wanted = {}
    for j = from, upto do wanted[#wanted + 1] = 'q' .. ids[j] end
    local data = redis.call('HMGET', hash, unpack(wanted))
    for j = from, upto do out[j] = decode_ticket(ids[j], data[j - from + 1]) end
  end
  return out
end

local function forget_ticket(t)
  redis.call('ZREM', queue, t.id)
  redis.call('HDEL', hash, 'q' .. t.id)
  tenant_left(t.tenant)
  for c = 1, NC do
    pq[c] = pq[c] - t.cost[c]
    if pq[c] < 0 then pq[c] = 0 end
  end
end

local shadow_dirty = false
local function drop_shadow()
  shadow_dirty = true
end

-- No ticket waiting is promised any more (Queue::break_promises).
local function break_promises()
  -- Nobody waits (every ticket counts in what is pending): nothing to read.
  if pq[1] + pq[2] + pq[3] + pq[4] == 0 then return end
  -- The last ticket issued (the queue is in fair order, not in the order of ids).
  local last_id = tonumber(redis.call('HGET', hash, 'n') or 0) - 1
  if last_id > floor_id then
    floor_id = last_id
    redis.call('HSET', hash, 'pf', fmt(last_id))
  end
end

-- The levels changed other than by a ticket paying (the rule book's replan).
local function replan()
  drop_shadow()
  break_promises()
end

-- Promised tickets due by now pass, each charged at its due time, in order, before anything
-- else (KeyState::charge_due): the levels are still as of `last` here.
local levels_at = last
local charged_due = false
if pq[1] + pq[2] + pq[3] + pq[4] > 0 then
  while true do
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if not head then break end
    local t = parse_ticket(head)
    if t == nil or not promised(t) or t.due > now then break end
    if t.due > levels_at then
      for i = 1, k do levels[i] = refill(i, levels[i], t.due - levels_at) end
      levels_at = t.due
    end
    charge(levels, t.cost)
    forget_ticket(t)
    charged_due = true
  end
  -- Written at once, so that an operation refused below leaves them charged, as the rule
  -- book does.
  if charged_due then
    local out = {'t', fmt(levels_at)}
    for i = 1, k do
      out[#out + 1] = 'l' .. i
      out[#out + 1] = fmt(levels[i])
    end
    for c = 1, NC do
      out[#out + 1] = 'pq' .. c
      out[#out + 1] = fmt(pq[c])
    end
    redis.call('HSET', hash, unpack(out))
  end
end

-- The real levels now.
for i = 1, k do
  levels[i] = refill(i, levels[i], now - levels_at)
end

-- Drops lapsed tickets at the head of the queue.
local function expire_head()
  while true do
    local head = redis.call('ZRANGE', queue, 0, 0)
    if #head == 0 then return end
    local t = parse_ticket(head[1])
    if t ~= nil and t.lease >= now then return end
    if t == nil then
      redis.call('ZREM', queue, head[1])
    else
      forget_ticket(t)
    end
    drop_shadow()
  end
end

-- The shadow: stored, or rebuilt from the real levels by replaying the queue.
local function shadow()
  local st = redis.call('HGET', hash, 'st')
  if st and not shadow_dirty then
    local lv = {}
    for i = 1, k do
      lv[i] = tonumber(redis.call('HGET', hash, 's' .. i))
    end
    return tonumber(st), lv
  end
  local at = now
  if paused_until > at then at = paused_until end
  local lv = {}
  for i = 1, k do
    lv[i] = refill(i, levels[i], at - now)
  end
  local ids = redis.call('ZRANGE', queue, 0, -1)
  local tickets = parse_tickets(ids)
  for j = 1, #ids do
    local t = tickets[j]
    if t ~= nil then
      local due = at + wait_all(lv, zeros(), t.cost)
      -- A promised ticket pays at its due time, never sooner.
      if promised(t) and t.due > due then due = t.due end
      for i = 1, k do lv[i] = refill(i, lv[i], due - at) end
      at = due
      charge(lv, t.cost)
    end
  end
  shadow_dirty = false
  return at, lv
end

local function save_shadow(at, lv)
  local out = {'st', fmt(at)}
  for i = 1, k do
    table.insert(out, 's' .. i)
    table.insert(out, fmt(lv[i]))
  end
  redis.call('HSET', hash, unpack(out))
end

-- Adds `delta` to the real levels and to the stored schedule alike.
local function apply(delta)
  for c = 1, NC do
    if delta[c] ~= 0 then
      break_promises()
      break
    end
  end
  add_to(levels, delta)
  if redis.call('HEXISTS', hash, 'st') == 1 and not shadow_dirty then
    local at, lv = shadow()
    add_to(lv, delta)
    save_shadow(at, lv)
  end
end

-- Calls in flight -------------------------------------------------------------------------

local flights_changed = false
local flights_gone = false

local function decode_flight(id, data)
  if not data then return nil end
  local f = {}
  for part in string.gmatch(data, '%S+') do
    f[#f + 1] = tonumber(part)
  end
  if #f == 11 then
    -- Written before spend was a currency: three per currency, spend 0.
    return {id = id, at = f[1], charged = {f[2], f[3], f[4], 0}, done = f[5] == 1,
      level = {f[6], f[7], f[8], 0}, corrected = {f[9], f[10], f[11], 0}, full = 0}
  end
  -- Written before the windows found full were kept: none.
  return {id = id, at = f[1], charged = {f[2], f[3], f[4], f[5]}, done = f[6] == 1,
    level = {f[7], f[8], f[9], f[10]}, corrected = {f[11], f[12], f[13], f[14]},
    full = f[15] or 0}
end

local function encode_flight(f)
  local parts = {fmt(f.at)}
  for c = 1, NC do parts[#parts + 1] = fmt(f.charged[c]) end
  if f.done then parts[#parts + 1] = '1' else parts[#parts + 1] = '0' end
  for c = 1, NC do parts[#parts + 1] = fmt(f.level[c]) end
  for c = 1, NC do parts[#parts + 1] = fmt(f.corrected[c]) end
  parts[#parts + 1] = fmt(f.full)
  return table.concat(parts, ' ')
end

local function read_flight(id)
  if id < ffirst or id >= fnext then return nil end
  return decode_flight(id, redis.call('HGET', hash, 'f' .. fmt(id)))
end

-- Forgets, from the front, calls that settled and calls that outlived their lease; the cover
-- goes with the last call it could serve.
local function prune()
  while ffirst < fnext do
    local f = read_flight(ffirst)
    if f ~= nil and not f.done and f.at + FLIGHT_LEASE >= now then break end
    redis.call('HDEL', hash, 'f' .. fmt(ffirst))
    ffirst = ffirst + 1
    flights_changed = true
  end
  if ffirst >= fnext or ffirst > covers then
    for c = 1, NC do
      if cover[c] ~= 0 then flights_changed = true end
    end
    cover = zeros()
  end
end

-- A call charged `cost` goes out now: its number. Its record keeps what the tightest window of
-- each currency holds after it was charged, and the corrections so far.
local function fly(cost)
  prune()
  if fnext - ffirst >= MAX_FLIGHTS then
    redis.call('HDEL', hash, 'f' .. fmt(ffirst))
    ffirst = ffirst + 1
  end
  local id = fnext
  fnext = fnext + 1
  local level = zeros()
  for c = 1, NC do
    if tightest[c] ~= nil then level[c] = levels[tightest[c]] end
  end
  -- The windows the call found full (bit i - 1 for window i, the first 32): charged from their
  -- capacity, they hold exactly that capacity less the call now.
  local full = 0
  for i = 1, k do
    local paid = cost[w[i].cur]
    if i <= 32 and paid > 0 and levels[i] >= w[i].cap - paid * w[i].scale then
      full = full + 2 ^ (i - 1)
    end
  end
  local record = {at = now, charged = cost, done = false, level = level,
    corrected = copy(corrected), full = full}
  redis.call('HSET', hash, 'f' .. fmt(id), encode_flight(record), 'fa', fmt(now))
  flights_changed = true
  return id
end

-- What the calls that went out within the skew of `f`, before or after it, were charged, per
-- currency, and whether there were any.
local function close_to(f)
  local close = zeros()
  local ambiguous = false
  local id = f.id - 1
  while id >= ffirst do
    local o = read_flight(id)
    if o == nil or o.at + SKEW < f.at then break end
    ambiguous = true
    for c = 1, NC do close[c] = close[c] + o.charged[c] end
    id = id - 1
  end
  id = f.id + 1
  while id < fnext do
    local o = read_flight(id)
    if o == nil or o.at > f.at + SKEW then break end
    ambiguous = true
    for c = 1, NC do close[c] = close[c] + o.charged[c] end
    id = id + 1
  end
  return close, ambiguous
end

-- A call that found a window full made it start refilling when it went out; the provider's
-- started when it counted the call, `counted_after` ms later. That refill (at most the call's
-- charge) is the key's alone: taken off, exactly, once (by the call's sync, else its
-- settlement), except in the currencies `back` says the provider did not count it in; counted
-- as corrected. `charges` are what the call was charged (before a refusal's record changed
-- them). The record is written back.
local function credit_full(f, charges, counted_after, back)
  if f.full == 0 or counted_after <= 0 then return end
  for i = 1, k do
    local c = w[i].cur
    if i <= 32 and math.floor(f.full / 2 ^ (i - 1)) % 2 == 1 and not back[c] then
      local charge = units(i, charges[c])
      local over = charge
      if counted_after <= math.floor(charge / w[i].rate) then
        over = w[i].rate * counted_after
        if over > charge then over = charge end
      end
      if tightest[c] == i then
        corrected[c] = corrected[c] + floor_div(over, w[i].scale)
        flights_changed = true
      end
      levels[i] = clamp(i, levels[i] - over)
    end
  end
  f.full = 0
  redis.call('HSET', hash, 'f' .. fmt(f.id), encode_flight(f))
  replan()
end

-- Settles call `id` (charged `charged`, if the key no longer remembers it) with what it used
-- (-1: as charged), per currency; with `is_last` it is done. Answers what changed (positive: a
-- refund). The settle operation, and a sync that settles the call in the same step.
local function settle_flight(id, charged, used, is_last, counted_after)
  local f = read_flight(id)
  if f ~= nil then credit_full(f, copy(f.charged), counted_after, {false, false, false, false}) end
  local was = charged
  local coverable = false
  if f ~= nil then
    was = f.charged
    coverable = f.id <= covers
  end
  local delta = zeros()
  for c = 1, NC do
    if used[c] >= 0 and has[c] then
      local difference = was[c] - used[c]
      if difference >= 0 then
        delta[c] = difference
      else
        local shortfall = -difference
        local covered = 0
        if coverable then
          covered = shortfall
          if cover[c] < covered then covered = cover[c] end
          cover[c] = cover[c] - covered
          flights_changed = true
        end
        delta[c] = -(shortfall - covered)
      end
      if f ~= nil then f.charged[c] = used[c] end
    end
  end
  if f ~= nil then
    if is_last == 1 then f.done = true end
    redis.call('HSET', hash, 'f' .. fmt(f.id), encode_flight(f))
    if is_last == 1 then
      prune()
      if ffirst >= fnext then flights_gone = true end
    end
  end
  apply(delta)
  return delta
end

local function save_flights()
  if flights_gone then
    local gone = {'fn', 'ff', 'fa', 'cv'}
    for c = 1, NC do
      gone[#gone + 1] = 'c' .. c
      gone[#gone + 1] = 'k' .. c
    end
    redis.call('HDEL', hash, unpack(gone))
    return
  end
  if not flights_changed then return end
  local out = {'fn', fmt(fnext), 'ff', fmt(ffirst), 'cv', fmt(covers)}
  for c = 1, NC do
    out[#out + 1] = 'c' .. c
    out[#out + 1] = fmt(cover[c])
    out[#out + 1] = 'k' .. c
    out[#out + 1] = fmt(corrected[c])
  end
  redis.call('HSET', hash, unpack(out))
end

local function store()
  save_flights()
  local out = {'sig', sig, 't', fmt(now), 'p', fmt(paused_until)}
  for c = 1, NC do
    table.insert(out, 'pq' .. c)
    table.insert(out, fmt(pq[c]))
  end
  -- The buckets refill during a pause, but the pause itself must outlive it.
  local expire_ms = paused_until - now
  for i = 1, k do
    table.insert(out, 'l' .. i)
    table.insert(out, fmt(levels[i]))
    local room = w[i].cap - levels[i]
    if room > 0 then
      local fill = ceil_div(room, w[i].rate)
      if fill > expire_ms then expire_ms = fill end
    end
  end
  local queued = redis.call('ZCARD', queue)
  local ql = tonumber(redis.call('HGET', hash, 'ql') or 0)
  -- While tickets wait, the key lives a burst's refill past the last lease of any of them. A
  -- promised ticket's holder passes by reading its record, and its charge waits for the key's
  -- next operation, which must find the key still there with every window's level. A promise
  -- is kept only if every window can pay at its due time, so once the last one has paid each
  -- level is at least 0, and full again a burst's refill later at most (a window full before
  -- a ticket is due stops refilling, so counting from now would come short).
  if queued > 0 then
    local burst = 0
    for i = 1, k do
      local fill = ceil_div(w[i].cap, w[i].rate)
      if fill > burst then burst = fill end
    end
    if ql - now + burst > expire_ms then expire_ms = ql - now + burst end
  end
  if ffirst < fnext and not flights_gone then
    local fa = tonumber(redis.call('HGET', hash, 'fa') or now)
    if fa + FLIGHT_LEASE - now > expire_ms then expire_ms = fa + FLIGHT_LEASE - now end
  end
  if expire_ms > MAX_EXPIRE then expire_ms = MAX_EXPIRE end
  if REAL_CLOCK then
    -- When the key expires, as the fast path reads it (it renews the expiry only when it must).
    table.insert(out, 'x')
    table.insert(out, fmt(now + expire_ms + 1))
  end
  redis.call('HSET', hash, unpack(out))
  if shadow_dirty or queued == 0 then
    redis.call('HDEL', hash, 'st')
  end
  -- The key lives until its windows would be full again and no ticket or call in flight can
  -- still be claimed: then it carries no information.
  if REAL_CLOCK then
    redis.call('PEXPIRE', hash, expire_ms + 1)
    redis.call('PEXPIRE', queue, expire_ms + 1)
    if queued > 0 then redis.call('PEXPIRE', tenants, expire_ms + 1) end
  end
end

local function cost_args(from, lo)
  local cost = {}
  for c = 1, NC do
    cost[c] = int(ARGV[from + c - 1], lo, MAX)
    if cost[c] == nil then return nil end
  end
  return cost
end

local function note_lease(until_ms)
  local ql = tonumber(redis.call('HGET', hash, 'ql') or 0)
  if until_ms > ql then
    redis.call('HSET', hash, 'ql', fmt(until_ms))
  end
end

-- An admitted call: remembered as in flight when `flying`.
local function went(cost, flying)
  if flying then
    local id = fly(cost)
    store()
    return {'flying', id, now}
  end
  store()
  return {'ok', now}
end

-- Admission (the rule book's bucket/state/admission.rs): acquire, admit, cancel, adjust ----
if op == 'acquire' then
  local cost = cost_args(args + 1, 0)
  local max_wait = int(ARGV[args + NC + 1], -1, MAX)
  local flying = int(ARGV[args + NC + 2], 0, 1)
  local step = int(ARGV[args + NC + 3], 1, MAX)
  local tenant = ARGV[args + NC + 4]
  if tenant and not string.find(tenant, '^' .. string.rep('%x', 16) .. '$') then tenant = nil end
  if cost == nil or max_wait == nil or flying == nil or step == nil or tenant == nil then
    return fail('bad cost or max wait')
  end
  for i = 1, k do
    if cost[w[i].cur] > w[i].burst then return fail('bad cost or max wait') end
  end
  -- A cost of nothing is refused (as the rule book refuses it): so every ticket counts in what
  -- is pending, and a key with nothing pending has nobody waiting (what the fast path reads).
  if cost[1] + cost[2] + cost[3] + cost[4] == 0 then return fail('a cost of nothing') end
  expire_head()
  if now >= paused_until and wait_all(levels, pq, cost) == 0 then
    charge(levels, cost)
    if redis.call('HEXISTS', hash, 'st') == 1 and not shadow_dirty then
      local at, lv = shadow()
      charge(lv, cost)
      save_shadow(at, lv)
    end
    return went(cost, flying == 1)
  end
  -- Its fair place (Queue::fair_place): behind every ticket of a tag up to its own.
  local queued = redis.call('ZCARD', queue)
  if queued == 0 then redis.call('DEL', tenants) end
  local head_tag = 0
  if queued > 0 then head_tag = tonumber(redis.call('ZRANGE', queue, 0, 0, 'WITHSCORES')[2]) end
  local tag, waiting = tenant_entry(tenant)
  if head_tag > tag then tag = head_tag end
  tag = tag + step
  if tag > MAX then tag = MAX end
  local place = redis.call('ZCOUNT', queue, '-inf', tag)
  local id
  local function issue()
    id = field('n', 0, MAX, now * 1000)
    if id < now * 1000 then id = now * 1000 end
    redis.call('HSET', hash, 'n', fmt(id + 1))
    return ticket_text(id)
  end
  if place < queued then
    -- Ahead of tickets waiting (KeyState::acquire_ahead): due after the tickets ahead of its
    -- place, on a plan that keeps no promise (its place breaks them all).
    local at = now
    if paused_until > at then at = paused_until end
    local lv = {}
    for i = 1, k do lv[i] = refill(i, levels[i], at - now) end
    local ids = {}
    if place > 0 then ids = redis.call('ZRANGE', queue, 0, place - 1) end
    local ahead = parse_tickets(ids)
    for j = 1, #ids do
      local t = ahead[j]
      if t ~= nil then
        local due = at + wait_all(lv, zeros(), t.cost)
        for i = 1, k do lv[i] = refill(i, lv[i], due - at) end
        at = due
        charge(lv, t.cost)
      end
    end
    local due = at + wait_all(lv, zeros(), cost)
    if max_wait >= 0 and due - now > max_wait then
      store()
      return {'wait', due - now, now}
    end
    if queued >= MAX_QUEUE then
      store()
      return {'full', now}
    end
    local idtext = issue()
    break_promises()
    redis.call('ZADD', queue, tag, idtext)
    redis.call('HSET', hash, 'q' .. idtext, encode_ticket(due, due + lease, cost, false, tenant))
    redis.call('HSET', tenants, tenant, fmt(tag) .. ' ' .. fmt(waiting + 1))
    note_lease(due + lease)
    for c = 1, NC do pq[c] = pq[c] + cost[c] end
    drop_shadow()
    store()
    return {'queued', idtext, due - now, now}
  end
  local at, lv = shadow()
  -- The schedule as it stands, kept as of its own time (as the rule book keeps it): moved on to
  -- now, a correction added to it later (apply) would meet a level refilled up to the capacity
  -- that, as of its time, it would still have refilled past.
  local planned = {}
  for i = 1, k do planned[i] = lv[i] end
  local start = at
  if now > start then start = now end
  if paused_until > start then start = paused_until end
  for i = 1, k do lv[i] = refill(i, lv[i], start - at) end
  local due = start + wait_all(lv, zeros(), cost)
  if max_wait >= 0 and due - now > max_wait then
    store()
    if queued > 0 then
      save_shadow(at, planned)
    end
    return {'wait', due - now, now}
  end
  if queued >= MAX_QUEUE then
    store()
    return {'full', now}
  end
  for i = 1, k do lv[i] = refill(i, lv[i], due - start) end
  charge(lv, cost)
  local idtext = issue()
  -- Promised only behind promised tickets (Queue::all_promised).
  local promise = flying == 0
  if promise then
    local last_id = redis.call('ZREVRANGE', queue, 0, 0)[1]
    local behind = last_id and parse_ticket(last_id)
    if behind and not promised(behind) then promise = false end
  end
  redis.call('ZADD', queue, tag, idtext)
  redis.call('HSET', hash, 'q' .. idtext, encode_ticket(due, due + lease, cost, promise, tenant))
  redis.call('HSET', tenants, tenant, fmt(tag) .. ' ' .. fmt(waiting + 1))
  note_lease(due + lease)
  for c = 1, NC do pq[c] = pq[c] + cost[c] end
  store()
  save_shadow(due, lv)
  return {'queued', idtext, due - now, now}
elseif op == 'admit' then
  local id = int(ARGV[args + 1], 0, MAX)
  local flying = int(ARGV[args + 2], 0, 1)
  -- When the holder was told it is due (-1: not said).
  local due = int(ARGV[args + 3], -1, MAX)
  if id == nil or flying == nil or due == nil then return fail('bad ticket') end
  local t = parse_ticket(ticket_text(id))
  if t == nil then
    store()
    -- Gone between its due time and its lease's end: it was promised, and charged then.
    if flying == 0 and due >= 0 and due <= now and now <= due + lease then
      return {'ok', now}
    end
    return {'lost', now}
  end
  if promised(t) then
    -- Not due yet: a due one was charged before this operation.
    store()
    return {'wait', t.due - now, now}
  end
  -- A holder that comes back after its ticket's lease has lost its place: it lapsed.
  if t.lease < now then
    forget_ticket(t)
    drop_shadow()
    store()
    return {'lost', now}
  end
  -- Only the nearest tickets ahead are looked at, so that asking costs the same however long
  -- the line; lapsed ones among them are dropped now (they would only block this one). With
  -- more ahead, this ticket can't pass yet, and their cost is a lower bound.
  local ahead = zeros()
  local behind = false
  local rank = redis.call('ZRANK', queue, t.id) or 0
  local from = rank - SCAN_AHEAD
  if from < 0 then from = 0 end
  local nearest = {}
  if rank > 0 then nearest = redis.call('ZRANGE', queue, from, rank - 1) end
  local unseen = rank > SCAN_AHEAD
  local seen = parse_tickets(nearest)
  for n, other in ipairs(nearest) do
    local o = seen[n]
    if o == nil then
      redis.call('ZREM', queue, other)
    elseif o.lease < now then
      forget_ticket(o)
      drop_shadow()
    else
      behind = true
      for c = 1, NC do ahead[c] = ahead[c] + o.cost[c] end
    end
  end
  local wait = wait_all(levels, ahead, t.cost)
  local ready
  local paused = now < paused_until
  if paused then
    ready = paused_until
    if now + wait > ready then ready = now + wait end
  elseif wait == 0 and not unseen then
    charge(levels, t.cost)
    forget_ticket(t)
    return went(t.cost, flying == 1)
  elseif unseen then
    -- Calls this ticket did not look at are ahead. Guess their cost from those it saw, and ask
    -- again when half of the guess has passed: a waiter deep in the line asks a few times on
    -- its way to the front, not once per call ahead of it.
    local count = redis.call('ZRANK', queue, t.id) or 0
    local guess = {}
    for c = 1, NC do guess[c] = math.floor(ahead[c] * count / (2 * SCAN_AHEAD)) end
    local again = wait_all(levels, guess, t.cost)
    for i = 1, k do
      local refill_ms = wait_for(i, 0, units(i, t.cost[w[i].cur]))
      if refill_ms > again then again = refill_ms end
    end
    if again < 1 then again = 1 end
    ready = now + again
  else
    ready = now + wait
  end
  if ready + lease > t.lease then
    redis.call('HSET', hash, 'q' .. t.id,
      encode_ticket(t.due, ready + lease, t.cost, t.promise, t.tenant))
    note_lease(ready + lease)
  end
  store()
  -- In line behind calls yet to pass (and not paused): nothing failed, the line is not there.
  if behind and not paused then return {'behind', ready - now, now} end
  return {'wait', ready - now, now}
elseif op == 'cancel' then
  local id = int(ARGV[args + 1], 0, MAX)
  local due = int(ARGV[args + 2], -1, MAX)
  if id == nil or due == nil then return fail('bad ticket') end
  local t = parse_ticket(ticket_text(id))
  if t ~= nil then
    forget_ticket(t)
    -- The tickets behind it may pass sooner than they were promised: planned again (a
    -- cancelled waiter frees its place in line), as the rule book's cancel.
    break_promises()
    drop_shadow()
  end
  expire_head()
  store()
  -- Promised and charged at its due time already: the caller gives the charge back.
  if t == nil and due >= 0 and due <= now and now <= due + lease then
    return {'ok', now}
  end
  return {'done', now}
elseif op == 'adjust' then
  local delta = {}
  for c = 1, NC do
    delta[c] = int(ARGV[args + c], -MAX, MAX)
    if delta[c] == nil then return fail('bad adjustment') end
  end
  apply(delta)
  store()
  return {'done', now}
-- The provider's ledger (bucket/state/ledger.rs): penalize, lower, sync, settle -----------
elseif op == 'penalize' then
  local pause = int(ARGV[args + 1], 0, MAX - now)
  local spent = int(ARGV[args + 2], 0, 15)
  -- The refusal: the provider's own pause in ms (-1: none), the refused call's flight, what it
  -- needed (4) and what went out after it (4), where the key does not remember it.
  local hint = int(ARGV[args + 3], -1, MAX)
  if pause == nil or spent == nil or hint == nil then return fail('bad pause') end
  local need, later, refused = nil, nil, nil
  if hint >= 0 then
    refused = int(ARGV[args + 4], 0, MAX)
    need = cost_args(args + 5, 0)
    later = cost_args(args + 5 + NC, 0)
    if refused == nil or need == nil or later == nil then return fail('bad refusal') end
    -- What went out after the refused call, from the key's own record where it has one.
    local f = nil
    if refused > 0 then f = read_flight(refused) end
    if f ~= nil then
      later = zeros()
      for id = f.id + 1, fnext - 1 do
        local o = read_flight(id)
        if o ~= nil then
          for c = 1, NC do later[c] = later[c] + o.charged[c] end
        end
      end
    else
      refused = nil
    end
  end
  local bit = {1, 2, 4, 8}
  local emptied = {-1, -1, -1, -1}
  for i = 1, k do
    local c = w[i].cur
    if math.floor(spent / bit[c]) % 2 == 1 then
      local target = nil
      if need == nil then
        target = 0
      elseif tightest[c] == i then
        -- What the call needed when the provider's pause ends, less what went out after it.
        local floor_u = -DEBT * w[i].cap
        local t = units(i, need[c]) - units(i, later[c])
        if t < floor_u or hint > math.floor((t - floor_u) / w[i].rate) then
          target = floor_u
        else
          target = clamp(i, t - w[i].rate * hint)
        end
      end
      if target ~= nil then
        local taken = 0
        if levels[i] > target then taken = floor_div(levels[i] - target, w[i].scale) end
        if emptied[c] < 0 or taken < emptied[c] then emptied[c] = taken end
        if levels[i] > target then levels[i] = target end
      end
    end
  end
  for c = 1, NC do
    if emptied[c] < 0 then emptied[c] = 0 end
  end
  if now + pause > paused_until then paused_until = now + pause end
  if ffirst < fnext then
    -- The refusal counted the calls up to the refused one; a penalty without one, every call
    -- out.
    covers = fnext - 1
    if refused ~= nil then covers = refused end
    -- The windows of the spent currencies now hold what the provider does: the refill a
    -- counted call that found them full would have given back is in that already.
    for id = ffirst, covers do
      local o = read_flight(id)
      if o ~= nil and o.full > 0 then
        local full = o.full
        for i = 1, k do
          local c = w[i].cur
          if i <= 32 and math.floor(spent / bit[c]) % 2 == 1
              and math.floor(full / 2 ^ (i - 1)) % 2 == 1 then
            full = full - 2 ^ (i - 1)
          end
        end
        if full ~= o.full then
          o.full = full
          redis.call('HSET', hash, 'f' .. fmt(o.id), encode_flight(o))
          replan()
        end
      end
    end
    for c = 1, NC do
      if math.floor(spent / bit[c]) % 2 == 1 then
        cover[c] = emptied[c]
        -- What the windows held, the provider says is spent: taken off for spending
        -- elsewhere, like a sync's correction.
        corrected[c] = corrected[c] + emptied[c]
      end
    end
    flights_changed = true
  end
  replan()
  store()
  return {'emptied', emptied[1], emptied[2], emptied[3], emptied[4], now}
elseif op == 'lower' then
  local cur = int(ARGV[args + 1], 1, NC)
  local remaining = int(ARGV[args + 2], 0, MAX)
  if cur == nil or remaining == nil then return fail('bad currency or count') end
  -- How far above `remaining` the window closest to it was (negative: below).
  local above = nil
  for i = 1, k do
    if w[i].cur == cur then
      local r = remaining
      if r > w[i].burst then r = w[i].burst end
      local target = r * w[i].scale
      local tokens = whole(i, levels[i] - target)
      if levels[i] > target then levels[i] = target end
      if above == nil or tokens < above then above = tokens end
    end
  end
  if above == nil then above = 0 end
  replan()
  store()
  return {'lowered', above, now}
elseif op == 'sync' then
  local id = int(ARGV[args + 1], 0, MAX)
  local charged = cost_args(args + 2, 0)
  local remaining = cost_args(args + 2 + NC, -1)
  local elsewhere = cost_args(args + 2 + 2 * NC, 0)
  local returnable = cost_args(args + 2 + 3 * NC, 0)
  local margin = cost_args(args + 2 + 4 * NC, 0)
  local if_more = cost_args(args + 2 + 5 * NC, 0)
  -- 0: not refused; 16 + a mask of the currencies given back (requests 1, tokens 2, output 4,
  -- spend 8).
  local refused = int(ARGV[args + 2 + 6 * NC], 0, 31)
  -- How long after the call went out the provider counted it, in ms.
  local counted_after = int(ARGV[args + 3 + 6 * NC], 0, MAX)
  if id == nil or charged == nil or remaining == nil or elsewhere == nil or returnable == nil
    or margin == nil or if_more == nil or refused == nil or counted_after == nil then
    return fail('bad sync')
  end
  -- Then, optionally, the call's settlement as done in the same step: 1 and what it used (4,
  -- -1: as charged).
  local then_used = nil
  if ARGV[args + 4 + 6 * NC] ~= nil then
    if int(ARGV[args + 4 + 6 * NC], 1, 1) == nil then return fail('bad sync') end
    then_used = cost_args(args + 5 + 6 * NC, -1)
    if then_used == nil then return fail('bad sync') end
  end
  for c = 1, NC do
    if if_more[c] > 1 then return fail('bad sync') end
  end
  local taken = {}
  for c = 1, NC do taken[c] = -elsewhere[c] end
  apply(taken)
  local tracked = ffirst < fnext
  if tracked then
    for c = 1, NC do corrected[c] = corrected[c] + elsewhere[c] end
    flights_changed = true
  end
  local f = read_flight(id)
  local before, ambiguous = zeros(), true
  if f ~= nil then before, ambiguous = close_to(f) end
  local own = charged
  if f ~= nil then own = copy(f.charged) end
  local back = {false, false, false, false}
  if refused >= 16 then
    local mask = refused - 16
    for c = 1, NC do back[c] = math.floor(mask / 2 ^ (c - 1)) % 2 == 1 end
    -- The provider refused the call and counted nothing of it in the currencies it gives
    -- back: its record no longer counts there, and it is done. Its charge stays in the
    -- windows: a 429 never raises one.
    if f ~= nil then
      for c = 1, NC do if back[c] then f.charged[c] = 0 end end
      f.done = true
      redis.call('HSET', hash, 'f' .. fmt(f.id), encode_flight(f))
    end
  end
  if f ~= nil then credit_full(f, own, counted_after, back) end
  local above = {}
  local spent = {}
  local lowered = zeros()
  local returned = zeros()
  for c = 1, NC do
    local t = tightest[c]
    if remaining[c] >= 0 and t ~= nil then
      local r = remaining[c]
      if r > w[t].burst then r = w[t].burst end
      local counted = r * w[t].scale
      if f == nil then
        above[c] = whole(t, levels[t] - counted)
        for i = 1, k do
          if w[i].cur == c then
            local ri = remaining[c]
            if ri > w[i].burst then ri = w[i].burst end
            if levels[i] > ri * w[i].scale then levels[i] = ri * w[i].scale end
          end
        end
      else
        -- The call's own charge is in its record; a refused call is not in the count, so it is
        -- added back to read the record like the count; then the refill from when the call went
        -- out to when the provider counted it (the key's windows had it, the provider's not
        -- yet). Calls that went out close to it are left out of what is taken off, whichever
        -- side of it they were counted on.
        local held = f.level[c]
        if back[c] then held = clamp(t, held + units(t, own[c])) end
        held = refill(t, held, counted_after)
        -- What was spent elsewhere if the provider counted the calls in the order they went
        -- out: a sample for the model.
        local likely = whole(t, held - counted)
        local excess = whole(t, held - units(t, before[c]) - counted)
        local since = corrected[c] - f.corrected[c]
        above[c] = excess
        spent[c] = likely + f.corrected[c]
        -- What this count finds spent elsewhere beyond what was corrected: the likely amount,
        -- but never more than the margin beyond the least there can be.
        local found_more = likely - since
        if excess - since + margin[c] < found_more then found_more = excess - since + margin[c] end
        local m = margin[c]
        if if_more[c] == 1 and found_more <= 0 then m = 0 end
        local take = found_more + m
        if tracked and take > 0 then
          corrected[c] = corrected[c] + take
          lowered[c] = take
          if found_more > 0 then
            local covered = found_more
            if take < covered then covered = take end
            cover[c] = covered
            covers = f.id
          end
          local delta = zeros()
          delta[c] = -take
          apply(delta)
          flights_changed = true
        elseif tracked and take < 0 then
          local back = -take
          if returnable[c] < back then back = returnable[c] end
          if back > 0 then
            corrected[c] = corrected[c] - back
            returned[c] = back
            local delta = zeros()
            delta[c] = back
            apply(delta)
            flights_changed = true
          end
        end
      end
    end
  end
  local since_ms = 0
  if f ~= nil then since_ms = now - f.at end
  if refused >= 16 and ffirst < fnext then
    prune()
    if ffirst >= fnext then flights_gone = true end
  end
  local settled = nil
  if then_used ~= nil then settled = settle_flight(id, charged, then_used, 1, counted_after) end
  replan()
  store()
  local reply = {'synced'}
  for c = 1, NC do
    if above[c] == nil then table.insert(reply, '') else table.insert(reply, above[c]) end
  end
  for c = 1, NC do
    if spent[c] == nil then table.insert(reply, '') else table.insert(reply, spent[c]) end
  end
  local amb = 0
  if ambiguous then amb = 1 end
  table.insert(reply, amb)
  table.insert(reply, since_ms)
  for c = 1, NC do table.insert(reply, lowered[c]) end
  for c = 1, NC do table.insert(reply, returned[c]) end
  table.insert(reply, now)
  if settled ~= nil then
    for c = 1, NC do table.insert(reply, settled[c]) end
  end
  return reply
elseif op == 'settle' then
  local id = int(ARGV[args + 1], 0, MAX)
  local charged = cost_args(args + 2, 0)
  local used = cost_args(args + 2 + NC, -1)
  local is_last = int(ARGV[args + 2 + 2 * NC], 0, 1)
  local counted_after = int(ARGV[args + 3 + 2 * NC], 0, MAX)
  if id == nil or charged == nil or used == nil or is_last == nil or counted_after == nil then
    return fail('bad settlement')
  end
  local delta = settle_flight(id, charged, used, is_last, counted_after)
  store()
  return {'settled', delta[1], delta[2], delta[3], delta[4], now}
elseif op == 'snapshot' then
  local reply = {'levels', now}
  for i = 1, k do
    table.insert(reply, levels[i])
  end
  return reply
elseif op == 'ping' then
  return {'done', now}
end
return fail('unknown operation ' .. tostring(op))

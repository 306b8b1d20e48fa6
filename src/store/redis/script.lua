-- tollgate: one key's windows and queue, checked and changed all or nothing, in one round trip.
--
-- KEYS[1]  the key's hash: levels, times, the shadow schedule, the tickets' data
-- KEYS[2]  the key's queue: a sorted set of ticket ids (score = id), in arrival order
-- ARGV[1]  operation: acquire, admit, cancel, adjust, penalize, lower, snapshot or ping
-- ARGV[2]  the limits' canonical text: a key holding other limits is refused
-- ARGV[3]  the time in milliseconds, or "" for the server's TIME (tests pass explicit times)
-- ARGV[4]  the number of windows k (1 to 32)
-- ARGV[5]  the lease of a ticket in milliseconds: how long past its due time it is kept
--          without its holder asking for it
-- then for each window, four integers: its currency (1 requests, 2 tokens, 3 output tokens),
--          scale S (units per token), refill n (units per millisecond), capacity C = burst * S
-- then the operation's own arguments:
--   acquire   requests, tokens, output tokens, max wait in ms (-1: none)
--   admit     ticket id
--   cancel    ticket id
--   adjust    requests, tokens, output tokens to add (negative: to take)
--   penalize  the pause in milliseconds
--   lower     currency, remaining tokens (reply: lowered, how far above remaining the closest window was)
--
-- Every quantity is an integer below 2^53, where Lua's doubles are exact: the client refuses
-- limits whose capacity passes 2^46, and this script checks every argument again, answering an
-- error rather than computing with a value out of range. Levels stay between -64 C and C. The
-- one loop whose length depends on the data walks the key's own queue, which holds only live
-- calls; no correction loop depends on a value.
--
-- Hash fields: sig (the limits), t (time of the real levels), p (end of a pause), l1..lk (real
-- levels in units), n (the next ticket id), pq1..pq3 (what the tickets will pay, per currency),
-- st and s1..sk (the shadow: the levels once every ticket has paid, as of the last one's due
-- time; absent when it must be rebuilt), ql (the latest lease of any ticket), and for each
-- ticket q<id> = "due lease requests tokens output_tokens".
--
-- Replies: {"ok", now} | {"queued", id, due_in, now} | {"wait", ms, now} |
--          {"behind", ms, now} | {"lost", now} | {"done", now} | {"levels", now, l1, ..} |
--          {"conflict", sig}

local hash = KEYS[1]
local queue = KEYS[2]
local MAX = 9007199254740991 -- 2^53 - 1
local MAX_CAP = 70368744177664 -- 2^46
local DEBT = 64
-- The longest queue a key may have: rebuilding the shadow replays all of it.
local MAX_QUEUE = 100000
-- How many of the tickets ahead of it an asking ticket looks at (as in the memory store).
local SCAN_AHEAD = 32

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

local op = ARGV[1]
local sig = ARGV[2]
local k = int(ARGV[4], 1, 32)
local lease = int(ARGV[5], 0, 4000000000000)
if k == nil or lease == nil then
  return fail('bad window count or lease')
end

local w = {}
for i = 1, k do
  local b = 5 + (i - 1) * 4
  local cur = int(ARGV[b + 1], 1, 3)
  local scale = int(ARGV[b + 2], 1, MAX_CAP)
  local rate = int(ARGV[b + 3], 1, MAX_CAP)
  local cap = int(ARGV[b + 4], 1, MAX_CAP)
  if cur == nil or scale == nil or rate == nil or cap == nil or cap % scale ~= 0 then
    return fail('bad parameters for window ' .. i)
  end
  w[i] = {cur = cur, scale = scale, rate = rate, cap = cap, burst = cap / scale}
end
local args = 5 + k * 4

-- The key's fields, read in one call.
local names = {'sig', 't', 'p', 'pq1', 'pq2', 'pq3'}
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
local pq = {field('pq1', 0, MAX, 0), field('pq2', 0, MAX, 0), field('pq3', 0, MAX, 0)}
if bad_field then
  return fail('the stored field ' .. bad_field .. ' is out of range')
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

-- The real levels now.
local elapsed = now - last
for i = 1, k do
  levels[i] = refill(i, levels[i], elapsed)
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

local function decode_ticket(id, data)
  if not data then return nil end
  local f = {}
  for part in string.gmatch(data, '%S+') do
    f[#f + 1] = tonumber(part)
  end
  return {id = id, due = f[1], lease = f[2], cost = {f[3], f[4], f[5]}}
end

local function parse_ticket(id)
  return decode_ticket(id, redis.call('HGET', hash, 'q' .. id))
end

-- The tickets `ids`, in order, read a thousand to a call; nil for one that is gone.
local function parse_tickets(ids)
  local out = {}
  for from = 1, #ids, 1000 do
    local last = math.min(#ids, from + 999)
    local fields = {}
    for j = from, last do fields[#fields + 1] = 'q' .. ids[j] end
    local data = redis.call('HMGET', hash, unpack(fields))
    for j = from, last do out[j] = decode_ticket(ids[j], data[j - from + 1]) end
  end
  return out
end

local function forget_ticket(t)
  redis.call('ZREM', queue, t.id)
  redis.call('HDEL', hash, 'q' .. t.id)
  for c = 1, 3 do
    pq[c] = pq[c] - t.cost[c]
    if pq[c] < 0 then pq[c] = 0 end
  end
end

local shadow_dirty = false
local function drop_shadow()
  shadow_dirty = true
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
      local due = at + wait_all(lv, {0, 0, 0}, t.cost)
      for i = 1, k do lv[i] = refill(i, lv[i], due - at) end
      at = due
      charge(lv, t.cost)
    end
  end
  shadow_dirty = false
  return at, lv
end

local function save_shadow(at, lv)
  local fields = {'st', string.format('%.0f', at)}
  for i = 1, k do
    table.insert(fields, 's' .. i)
    table.insert(fields, string.format('%.0f', lv[i]))
  end
  redis.call('HSET', hash, unpack(fields))
end

local function store()
  local fields = {'sig', sig, 't', string.format('%.0f', now), 'p', string.format('%.0f', paused_until)}
  for c = 1, 3 do
    table.insert(fields, 'pq' .. c)
    table.insert(fields, string.format('%.0f', pq[c]))
  end
  -- The buckets refill during a pause, but the pause itself must outlive it.
  local expire_ms = paused_until - now
  for i = 1, k do
    table.insert(fields, 'l' .. i)
    table.insert(fields, string.format('%.0f', levels[i]))
    local room = w[i].cap - levels[i]
    if room > 0 then
      local fill = ceil_div(room, w[i].rate)
      if fill > expire_ms then expire_ms = fill end
    end
  end
  redis.call('HSET', hash, unpack(fields))
  if shadow_dirty or redis.call('ZCARD', queue) == 0 then
    redis.call('HDEL', hash, 'st')
  end
  local ql = tonumber(redis.call('HGET', hash, 'ql') or 0)
  if redis.call('ZCARD', queue) > 0 and ql - now > expire_ms then
    expire_ms = ql - now
  end
  -- The key lives until its windows would be full again and no ticket can still be claimed:
  -- then it carries no information.
  redis.call('PEXPIRE', hash, expire_ms + 1)
  redis.call('PEXPIRE', queue, expire_ms + 1)
end

local function cost_args(from)
  local cost = {}
  for c = 1, 3 do
    cost[c] = int(ARGV[from + c - 1], 0, MAX)
    if cost[c] == nil then return nil end
  end
  for i = 1, k do
    if cost[w[i].cur] > w[i].burst then return nil end
  end
  return cost
end

local function note_lease(until_ms)
  local ql = tonumber(redis.call('HGET', hash, 'ql') or 0)
  if until_ms > ql then
    redis.call('HSET', hash, 'ql', string.format('%.0f', until_ms))
  end
end

if op == 'acquire' then
  local cost = cost_args(args + 1)
  local max_wait = int(ARGV[args + 4], -1, MAX)
  if cost == nil or max_wait == nil then
    return fail('bad cost or max wait')
  end
  expire_head()
  if now >= paused_until and wait_all(levels, pq, cost) == 0 then
    charge(levels, cost)
    if redis.call('HEXISTS', hash, 'st') == 1 and not shadow_dirty then
      local at, lv = shadow()
      charge(lv, cost)
      save_shadow(at, lv)
    end
    store()
    return {'ok', now}
  end
  local at, lv = shadow()
  local start = at
  if now > start then start = now end
  if paused_until > start then start = paused_until end
  for i = 1, k do lv[i] = refill(i, lv[i], start - at) end
  local due = start + wait_all(lv, {0, 0, 0}, cost)
  if max_wait >= 0 and due - now > max_wait then
    store()
    if redis.call('ZCARD', queue) > 0 then
      save_shadow(start, lv)
    end
    return {'wait', due - now, now}
  end
  if redis.call('ZCARD', queue) >= MAX_QUEUE then
    return fail('the queue of this key is full (' .. MAX_QUEUE .. ' calls wait)')
  end
  for i = 1, k do lv[i] = refill(i, lv[i], due - start) end
  charge(lv, cost)
  local id = field('n', 0, MAX, now * 1000)
  if id < now * 1000 then id = now * 1000 end
  redis.call('HSET', hash, 'n', string.format('%.0f', id + 1))
  local idtext = string.format('%.0f', id)
  redis.call('ZADD', queue, id, idtext)
  redis.call('HSET', hash, 'q' .. idtext,
    string.format('%.0f %.0f %.0f %.0f %.0f', due, due + lease, cost[1], cost[2], cost[3]))
  note_lease(due + lease)
  for c = 1, 3 do pq[c] = pq[c] + cost[c] end
  store()
  save_shadow(due, lv)
  return {'queued', idtext, due - now, now}
elseif op == 'admit' then
  local id = int(ARGV[args + 1], 0, MAX)
  if id == nil then return fail('bad ticket') end
  local t = parse_ticket(string.format('%.0f', id))
  if t == nil then
    store()
    return {'lost', now}
  end
  -- Only the nearest tickets ahead are looked at, so that asking costs the same however long
  -- the line; lapsed ones among them are dropped now (they would only block this one). With
  -- more ahead, this ticket can't pass yet, and their cost is a lower bound.
  local ahead = {0, 0, 0}
  local behind = false
  local nearest = redis.call('ZREVRANGEBYSCORE', queue, '(' .. t.id, '-inf', 'LIMIT', 0, SCAN_AHEAD + 1)
  local unseen = #nearest > SCAN_AHEAD
  if unseen then nearest[SCAN_AHEAD + 1] = nil end
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
      for c = 1, 3 do ahead[c] = ahead[c] + o.cost[c] end
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
    store()
    return {'ok', now}
  elseif unseen then
    -- Calls this ticket did not look at are ahead. Guess their cost from those it saw, and ask
    -- again when half of the guess has passed: a waiter deep in the line asks a few times on
    -- its way to the front, not once per call ahead of it.
    local count = redis.call('ZCOUNT', queue, '-inf', '(' .. t.id)
    local guess = {}
    for c = 1, 3 do guess[c] = math.floor(ahead[c] * count / (2 * SCAN_AHEAD)) end
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
      string.format('%.0f %.0f %.0f %.0f %.0f', t.due, ready + lease, t.cost[1], t.cost[2], t.cost[3]))
    note_lease(ready + lease)
  end
  store()
  -- In line behind calls yet to pass (and not paused): nothing failed, the line is not there.
  if behind and not paused then return {'behind', ready - now, now} end
  return {'wait', ready - now, now}
elseif op == 'cancel' then
  local id = int(ARGV[args + 1], 0, MAX)
  if id == nil then return fail('bad ticket') end
  local t = parse_ticket(string.format('%.0f', id))
  if t ~= nil then
    forget_ticket(t)
    drop_shadow()
  end
  expire_head()
  store()
  return {'done', now}
elseif op == 'adjust' then
  local delta = {}
  for c = 1, 3 do
    delta[c] = int(ARGV[args + c], -MAX, MAX)
    if delta[c] == nil then return fail('bad adjustment') end
  end
  local function apply(lv)
    for i = 1, k do
      local d = delta[w[i].cur]
      local limit = (DEBT + 2) * w[i].burst
      if d > limit then d = limit end
      if d < -limit then d = -limit end
      lv[i] = clamp(i, lv[i] + d * w[i].scale)
    end
  end
  apply(levels)
  if redis.call('HEXISTS', hash, 'st') == 1 then
    local at, lv = shadow()
    apply(lv)
    save_shadow(at, lv)
  end
  store()
  return {'done', now}
elseif op == 'penalize' then
  local pause = int(ARGV[args + 1], 0, MAX - now)
  if pause == nil then return fail('bad pause') end
  for i = 1, k do
    if levels[i] > 0 then levels[i] = 0 end
  end
  if now + pause > paused_until then paused_until = now + pause end
  drop_shadow()
  store()
  return {'done', now}
elseif op == 'lower' then
  local cur = int(ARGV[args + 1], 1, 3)
  local remaining = int(ARGV[args + 2], 0, MAX)
  if cur == nil or remaining == nil then return fail('bad currency or count') end
  -- How far above `remaining` the window closest to it was (negative: below).
  local above = nil
  for i = 1, k do
    if w[i].cur == cur then
      local r = remaining
      if r > w[i].burst then r = w[i].burst end
      local target = r * w[i].scale
      local tokens
      if levels[i] >= target then
        tokens = floor_div(levels[i] - target, w[i].scale)
        levels[i] = target
      else
        tokens = -ceil_div(target - levels[i], w[i].scale)
      end
      if above == nil or tokens < above then above = tokens end
    end
  end
  if above == nil then above = 0 end
  drop_shadow()
  store()
  return {'lowered', above, now}
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

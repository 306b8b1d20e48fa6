-- tollgate: check and charge every bucket of one key, all or nothing, in one round trip.
--
-- KEYS[1]  the key's hash, `{prefix:key}`
-- ARGV[1]  operation: "acquire", "adjust", "drain", "penalize" or "snapshot"
-- ARGV[2]  the limits' canonical text: a key holding other limits is refused
-- ARGV[3]  the time in milliseconds, or "" for the server's TIME (tests pass explicit times)
-- ARGV[4]  the number of buckets k
-- ARGV[5]  for "penalize", the pause in milliseconds (else 0)
--          then for each bucket, four integers:
--          scale S (units per token), refill n (units per millisecond),
--          capacity C = burst * S, and the amount in units (cost, or adjustment delta).
--
-- Every quantity is an integer below 2^53, so Lua's doubles hold it exactly; the client
-- refuses limits that could leave that range. Hash fields: "sig" the limits, "t" the time of
-- the last update, "p" the end of a pause (a provider's 429), "l1".."lk" the levels in units.
--
-- Replies: {"ok", now} | {"wait", milliseconds, now} | {"conflict", sig} | {"levels", now, l1, ..}

local key = KEYS[1]
local op = ARGV[1]
local sig = ARGV[2]
local k = tonumber(ARGV[4])

local stored = redis.call('HGET', key, 'sig')
if stored and stored ~= sig then
  return {'conflict', stored}
end

local now
if ARGV[3] ~= '' then
  now = tonumber(ARGV[3])
else
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end
local last = tonumber(redis.call('HGET', key, 't') or now)
-- One clock, but a late writer may still carry an older reading: time never runs backwards.
if now < last then
  now = last
end
local elapsed = now - last
local paused_until = tonumber(redis.call('HGET', key, 'p') or 0)

-- ceil(a / b) for integers a >= 0, b > 0, corrected for the rounding of the division.
local function ceil_div(a, b)
  local q = math.floor(a / b)
  while q * b < a do q = q + 1 end
  while q > 0 and (q - 1) * b >= a do q = q - 1 end
  return q
end

local levels = {}
local params = {}
for i = 1, k do
  local base = 5 + (i - 1) * 4
  local p = {
    scale = tonumber(ARGV[base + 1]),
    rate = tonumber(ARGV[base + 2]),
    cap = tonumber(ARGV[base + 3]),
    amount = tonumber(ARGV[base + 4]),
  }
  params[i] = p
  local level = tonumber(redis.call('HGET', key, 'l' .. i) or p.cap)
  local room = p.cap - level
  if room > 0 then
    -- rate * elapsed is exact below 2^53; above, it is certainly more than the room.
    local gain = p.rate * elapsed
    if gain >= room then level = p.cap else level = level + gain end
  elseif level > p.cap then
    level = p.cap
  end
  levels[i] = level
end

local function store(levels_to_write)
  local fields = {'sig', sig, 't', string.format('%.0f', now), 'p', string.format('%.0f', paused_until)}
  -- The buckets refill during a pause, but the pause itself must outlive it.
  local expire_ms = paused_until - now
  for i = 1, k do
    table.insert(fields, 'l' .. i)
    table.insert(fields, string.format('%.0f', levels_to_write[i]))
    local room = params[i].cap - levels_to_write[i]
    if room > 0 then
      local fill = ceil_div(room, params[i].rate)
      if fill > expire_ms then expire_ms = fill end
    end
  end
  redis.call('HSET', key, unpack(fields))
  -- The key lives until its buckets would be full again: then it carries no information.
  redis.call('PEXPIRE', key, expire_ms + 1)
end

if op == 'acquire' then
  local wait = 0
  if paused_until > now then wait = paused_until - now end
  for i = 1, k do
    local needed = params[i].amount
    if levels[i] < needed then
      local w = ceil_div(needed - levels[i], params[i].rate)
      if w > wait then wait = w end
    end
  end
  if wait > 0 then
    return {'wait', wait, now}
  end
  for i = 1, k do
    levels[i] = levels[i] - params[i].amount
  end
  store(levels)
  return {'ok', now}
elseif op == 'adjust' then
  for i = 1, k do
    local level = levels[i] + params[i].amount
    if level > params[i].cap then level = params[i].cap end
    levels[i] = level
  end
  store(levels)
  return {'ok', now}
elseif op == 'drain' or op == 'penalize' then
  for i = 1, k do
    if levels[i] > 0 then levels[i] = 0 end
  end
  if op == 'penalize' then
    local until_ms = now + tonumber(ARGV[5])
    if until_ms > paused_until then paused_until = until_ms end
  end
  store(levels)
  return {'ok', now}
elseif op == 'snapshot' then
  local reply = {'levels', now}
  for i = 1, k do
    table.insert(reply, levels[i])
  end
  return reply
end
return redis.error_reply('tollgate: unknown operation ' .. tostring(op))

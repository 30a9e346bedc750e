--[[
quotaflow's fair shares between tenants (quotaflow/budget/fair_share.py), on the Redis
server's clock, shared by every worker.

KEYS[1]  "{quotaflow:fair}:d:<budget>": per tenant T of one deployment's budget
           v:T  its virtual time: the budget-seconds it was admitted / its weight
           s:T  server time it last asked
           w:T  its weight
           n:T  its batch runs asking for this budget now
         T is active while n:T > 0 and s:T + ttl >= now (a run that died is
         forgotten after ttl).
KEYS[2]  "{quotaflow:fair}:slots": who waits for a worker
           q:T  server time since which T has had a batch queued that no worker took
           x:T  until when that mark holds (it is renewed by every batch sent back)
           n:T  T's batches running now, e:T until when that count holds
           y    server time until which no other running batch need yield
         T waits for a worker while marked and not running. A tenant only gives way
         to those waiting since before it: the longest waiter never does.

ARGV[1]  op, then its arguments:
  ask      tenant, weight, budget-seconds admitted since its last ask, active ttl,
           quantum (budget-seconds / weight), join (1: a run's first ask of this budget).
           A tenant (re)joining the active set starts at the lowest virtual time of the
           others: no credit for time it had no work, no debt from before; one back
           after a short absence (under 5 ttl) keeps up to CREDIT_S of what it was owed. It may be
           admitted while its virtual time is within quantum of the lowest other active
           tenant's; alone, always (work-conserving).
           -> "allowed wait active_tenants others_waiting"
  leave    tenant, weight, budget-seconds admitted since its last ask: one of its runs
           stops asking for this budget, charged for what it was admitted last
  queued   tenant, ttl: it has a batch in a queue (dispatched, or sent back)
  start    tenant, ttl: one of its batches reached a worker
  stop     tenant: that batch ended
  waiting  tenant -> how many tenants it gives way to
  yield    tenant, seconds -> 1 when one of its running batches should hand its slot
           back now for a waiting tenant (one batch per `seconds` in the cluster)
--]]

local op, tenant = ARGV[1], ARGV[2]
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local fmt = '%.17g'
local RUN_TTL_S = 30
local CREDIT_S = 1.0

local function fields(key)
  local rows, out = redis.call('HGETALL', key), {}
  for i = 1, #rows, 2 do out[rows[i]] = rows[i + 1] end
  return out
end

local function num(map, name) return tonumber(map[name]) or 0 end

-- Since when `name` has waited for a worker: marked, and no batch of it running.
local function waiting_since(slots, name)
  if not slots['q:' .. name] or num(slots, 'x:' .. name) < now then return nil end
  if num(slots, 'n:' .. name) > 0 and num(slots, 'e:' .. name) >= now then return nil end
  return num(slots, 'q:' .. name)
end

-- How many tenants `me` gives way to: those waiting for a worker since before it.
local function gives_way(me)
  local slots = fields(KEYS[2])
  local mine = waiting_since(slots, me)
  local n = 0
  for name in pairs(slots) do
    local other = string.match(name, '^q:(.*)$')
    if other and other ~= me then
      local since = waiting_since(slots, other)
      if since and (mine == nil or since < mine) then n = n + 1 end
    end
  end
  return n
end

local function keep(key) redis.call('PEXPIRE', key, RUN_TTL_S * 2000) end

if op == 'queued' then
  local slots = fields(KEYS[2])
  if not (slots['q:' .. tenant] and num(slots, 'x:' .. tenant) >= now) then
    redis.call('HSET', KEYS[2], 'q:' .. tenant, string.format(fmt, now))
  end
  redis.call('HSET', KEYS[2], 'x:' .. tenant, string.format(fmt, now + tonumber(ARGV[3])))
  keep(KEYS[2])
  return '0'
elseif op == 'start' then
  local slots = fields(KEYS[2])
  local running = num(slots, 'e:' .. tenant) >= now and num(slots, 'n:' .. tenant) or 0
  redis.call('HSET', KEYS[2], 'n:' .. tenant, math.max(0, running) + 1,
             'e:' .. tenant, string.format(fmt, now + RUN_TTL_S))
  redis.call('HDEL', KEYS[2], 'q:' .. tenant, 'x:' .. tenant)
  keep(KEYS[2])
  return '0'
elseif op == 'stop' then
  local left = redis.call('HINCRBY', KEYS[2], 'n:' .. tenant, -1)
  if left < 0 then redis.call('HSET', KEYS[2], 'n:' .. tenant, 0) end
  return '0'
elseif op == 'waiting' then
  return tostring(gives_way(tenant))
elseif op == 'yield' then
  if gives_way(tenant) == 0 or tonumber(redis.call('HGET', KEYS[2], 'y') or 0) > now then
    return '0'
  end
  redis.call('HSET', KEYS[2], 'y', string.format(fmt, now + tonumber(ARGV[3])))
  return '1'
elseif op == 'leave' then
  local charge = tonumber(ARGV[4])
  if charge > 0 then
    redis.call('HINCRBYFLOAT', KEYS[1], 'v:' .. tenant, charge / tonumber(ARGV[3]))
  end
  local left = redis.call('HINCRBY', KEYS[1], 'n:' .. tenant, -1)
  if left < 0 then redis.call('HSET', KEYS[1], 'n:' .. tenant, 0) end
  return '0'
end

-- ask
local weight, charge = tonumber(ARGV[3]), tonumber(ARGV[4])
local ttl, quantum, join = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local state = fields(KEYS[1])
local min_v, others_w, active, gone = nil, 0, 1, {}
for name, seen in pairs(state) do
  local other = string.match(name, '^s:(.*)$')
  if other and other ~= tenant then
    seen = tonumber(seen)
    if seen + ttl >= now and num(state, 'n:' .. other) > 0 then
      active = active + 1
      others_w = others_w + (tonumber(state['w:' .. other]) or 1)
      local v = num(state, 'v:' .. other)
      if min_v == nil or v < min_v then min_v = v end
    elseif seen + 10 * ttl < now then
      for _, kind in ipairs({'v:', 's:', 'w:', 'n:'}) do table.insert(gone, kind .. other) end
    end
  end
end
if #gone > 0 then redis.call('HDEL', KEYS[1], unpack(gone)) end

local mine = num(state, 'v:' .. tenant)
local seen = tonumber(state['s:' .. tenant])
local running = (seen ~= nil and seen + ttl >= now) and num(state, 'n:' .. tenant) or 0
if running <= 0 and min_v ~= nil then
  -- Away a short while (its batch handed back for a waiting tenant, or between two
  -- batches): keep up to CREDIT_S of what it is owed. Away longer: start level.
  if seen ~= nil and seen + 5 * ttl >= now then
    mine = math.max(mine, min_v - CREDIT_S)
  else
    mine = min_v
  end
end
mine = mine + charge / weight
redis.call('HSET', KEYS[1], 'v:' .. tenant, string.format(fmt, mine),
           's:' .. tenant, string.format(fmt, now), 'w:' .. tenant, weight,
           'n:' .. tenant, math.max(running + join, 1))
redis.call('PEXPIRE', KEYS[1], math.ceil(20 * ttl * 1000))
redis.call('HSET', KEYS[2], 'e:' .. tenant, string.format(fmt, now + RUN_TTL_S))

local allowed, wait = 1, 0
if min_v ~= nil and mine > min_v + quantum + 1e-9 then
  allowed = 0
  -- The others, taking the whole refill meanwhile, advance at 1 / their weights.
  wait = (mine - quantum - min_v) * others_w
end
return string.format('%d %.17g %d %d', allowed, wait, active, gives_way(tenant))

--[[
quotaflow's cluster-wide limiter: two continuously refilling buckets
(requests and tokens) for one deployment, updated atomically on the Redis
server's clock, so every worker on every machine spends one budget.

KEYS[1]  the deployment's hash, hash-tagged for Redis Cluster:
         "{quotaflow:rl:<deployment>}" with fields
           r    requests in the bucket (float; below 0 after a debt)
           t    tokens in the bucket   (float; below 0 after a debt)
           ts   server time of the last update (seconds, float)
           bu   server time until which nothing is admitted (after a 429)
           q:N  requests admitted in time slot N and not yet settled
           f:N  tokens admitted in time slot N and not yet settled
         Slot N = floor(server time / 10 s). A refund never lifts the tokens
         bucket above capacity minus the tokens still in flight: a provider whose
         bucket is nearly full loses part of a refund to its own ceiling. A slot
         older than the flight timeout is forgotten (its caller died).
         A missing hash is a full bucket; it expires once it would be full.

ARGV[1]  op: "acquire" | "settle" | "drain" | "clamp" | "peek"
ARGV[2]  requests refill rate per second      ARGV[3]  requests capacity
ARGV[4]  tokens refill rate per second        ARGV[5]  tokens capacity
ARGV[6]  flight timeout in seconds: the longest a call can be in flight
then, by op:
  acquire  ARGV[7] floor fraction (0..1), ARGV[8] safety margin (seconds of refill),
           ARGV[9..] token costs of k requests in order.
           Admits the longest prefix that fits above floor + margin, all-or-nothing
           per request over both buckets. The floor never exceeds capacity - cost, so
           a large request still fits a full bucket. The margin is the refill a
           provider's full bucket loses while a request travels to it.
           -> {admitted, wait_seconds_for_the_next, r, t, blocked_seconds, slot,
               tokens_in_flight}
  settle   ARGV[7] slot the call was admitted in, ARGV[8] its admitted cost,
           ARGV[9] tokens to refund (unused estimate; < 0 for a debt; 0 when the
           deployment does not reconcile)
  drain    ARGV[7] seconds: empty both buckets and admit nothing for that long;
           they start refilling, from empty, when the block ends
  clamp    ARGV[7] requests remaining, ARGV[8] tokens remaining ("" = unknown):
           lower the buckets to what the provider reports, never raise them
  peek     refills and reports; writes nothing
Every op returns {admitted, wait_seconds, r, t, blocked_seconds, slot, tokens_in_flight}
as strings.
--]]

local key = KEYS[1]
local op = ARGV[1]
local rate_r, cap_r = tonumber(ARGV[2]), tonumber(ARGV[3])
local rate_t, cap_t = tonumber(ARGV[4]), tonumber(ARGV[5])
local flight_timeout = tonumber(ARGV[6])
local SLOT_S, EPS = 10, 1e-9
local fmt = '%.17g'

local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local slot = math.floor(now / SLOT_S)
local oldest = slot - math.ceil(flight_timeout / SLOT_S)

local fields = redis.call('HGETALL', key)
local state, q, f, stale = {}, 0, 0, {}
for i = 1, #fields, 2 do
  local name, value = fields[i], tonumber(fields[i + 1])
  local kind, n = string.match(name, '^([qf]):(%d+)$')
  if kind then
    if tonumber(n) < oldest then
      table.insert(stale, name)
    elseif kind == 'q' then
      q = q + value
    else
      f = f + value
    end
  else
    state[name] = value
  end
end

local r = state.r or cap_r
local t = state.t or cap_t
local ts = state.ts or now
local bu = state.bu or 0
-- Nothing refills while a 429 block lasts: the bucket is empty when it ends.
local elapsed = math.max(0, now - math.max(ts, bu))
r = math.min(cap_r, r + elapsed * rate_r)
t = math.min(cap_t, t + elapsed * rate_t)

local admitted, wait = 0, 0

if op == 'acquire' then
  local floor, margin = tonumber(ARGV[7]), tonumber(ARGV[8])
  local cost_total = 0
  if now < bu then
    wait = bu - now
  else
    for i = 9, #ARGV do
      local cost = tonumber(ARGV[i])
      local floor_r = math.min(floor * cap_r + margin * rate_r, cap_r - 1)
      local floor_t = math.min(floor * cap_t + margin * rate_t, cap_t - cost)
      if r - 1 >= floor_r - EPS and t - cost >= floor_t - EPS then
        r, t = r - 1, t - cost
        admitted, cost_total = admitted + 1, cost_total + cost
      else
        wait = math.max(0, (1 + floor_r - r) / rate_r, (cost + floor_t - t) / rate_t)
        break
      end
    end
  end
  if admitted > 0 then
    redis.call('HINCRBYFLOAT', key, 'q:' .. slot, admitted)
    redis.call('HINCRBYFLOAT', key, 'f:' .. slot, cost_total)
    q, f = q + admitted, f + cost_total
  end
elseif op == 'settle' then
  local at, cost, refund = ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9])
  if tonumber(at) >= oldest then
    local left_q = tonumber(redis.call('HINCRBYFLOAT', key, 'q:' .. at, -1))
    local left_f = tonumber(redis.call('HINCRBYFLOAT', key, 'f:' .. at, -cost))
    if left_q <= EPS then redis.call('HDEL', key, 'q:' .. at, 'f:' .. at) end
    q, f = math.max(0, q - 1), math.max(0, f - cost)
    if left_f < -EPS then f = math.max(0, f + left_f) end
  end
  if refund < 0 then
    t = t + refund
  else
    t = math.max(t, math.min(t + refund, cap_t - f))
  end
elseif op == 'drain' then
  r, t = math.min(r, 0), math.min(t, 0)
  bu = math.max(bu, now + tonumber(ARGV[7]))
elseif op == 'clamp' then
  if ARGV[7] ~= '' then r = math.min(r, tonumber(ARGV[7])) end
  if ARGV[8] ~= '' then t = math.min(t, tonumber(ARGV[8])) end
end

local blocked = math.max(0, bu - now)
if op ~= 'peek' then
  if #stale > 0 then redis.call('HDEL', key, unpack(stale)) end
  redis.call('HSET', key, 'r', string.format(fmt, r), 't', string.format(fmt, t),
             'ts', string.format(fmt, now), 'bu', string.format(fmt, bu))
  -- Keep the hash while calls are in flight, a block lasts, or it is not yet full.
  local until_full = math.max((cap_r - r) / rate_r, (cap_t - t) / rate_t, blocked)
  local keep = until_full
  if q > EPS then keep = math.max(keep, flight_timeout + SLOT_S) end
  redis.call('PEXPIRE', key, math.ceil(keep * 1000) + 1000)
end
return {tostring(admitted), string.format(fmt, wait), string.format(fmt, r),
        string.format(fmt, t), string.format(fmt, blocked), tostring(slot),
        string.format(fmt, f)}

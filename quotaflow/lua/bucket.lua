--[[
quotaflow's cluster-wide limiter: two continuously refilling buckets
(requests and tokens) for one deployment, updated atomically on the Redis
server's clock, so every worker on every machine spends one budget.

KEYS[1]  the deployment's hash, hash-tagged for Redis Cluster:
         "{quotaflow:rl:<deployment>}" with fields
           r   requests in the bucket (float, may go below 0 after a debt)
           t   tokens in the bucket   (float, may go below 0 after a debt)
           ts  server time of the last update (seconds, float)
           bu  server time until which nothing is admitted (after a 429)
         A missing hash is a full bucket; it expires once it would be full.

ARGV[1]  op: "acquire" | "adjust" | "drain" | "clamp" | "peek"
ARGV[2]  requests refill rate per second      ARGV[3]  requests capacity
ARGV[4]  tokens refill rate per second        ARGV[5]  tokens capacity
then, by op:
  acquire  ARGV[6] floor fraction (0..1), ARGV[7..] token costs of k requests in order.
           Admits the longest prefix that fits above the floor, all-or-nothing per
           request over both buckets. The floor never exceeds capacity - cost, so a
           large request still fits a full bucket.
           -> {admitted_count, wait_seconds_for_the_next, r, t}
  adjust   ARGV[6] requests delta, ARGV[7] tokens delta (refund > 0, debt < 0)
  drain    ARGV[6] seconds: empty both buckets and admit nothing for that long;
           they start refilling, from empty, when the block ends
  clamp    ARGV[6] requests remaining, ARGV[7] tokens remaining ("" = unknown):
           lower the buckets to what the provider reports, never raise them
  peek     no extra arguments; refills but writes nothing
Every op returns {admitted_count, wait_seconds, r, t, blocked_seconds} as strings.
--]]

local key = KEYS[1]
local op = ARGV[1]
local rate_r, cap_r = tonumber(ARGV[2]), tonumber(ARGV[3])
local rate_t, cap_t = tonumber(ARGV[4]), tonumber(ARGV[5])
local EPS = 1e-9

local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000

local state = redis.call('HMGET', key, 'r', 't', 'ts', 'bu')
local r = tonumber(state[1]) or cap_r
local t = tonumber(state[2]) or cap_t
local ts = tonumber(state[3]) or now
local bu = tonumber(state[4]) or 0
-- Nothing refills while a 429 block lasts: the bucket is empty when it ends.
local elapsed = math.max(0, now - math.max(ts, bu))
r = math.min(cap_r, r + elapsed * rate_r)
t = math.min(cap_t, t + elapsed * rate_t)

local admitted, wait = 0, 0

if op == 'acquire' then
  local floor = tonumber(ARGV[6])
  if now < bu then
    wait = bu - now
  else
    for i = 7, #ARGV do
      local cost = tonumber(ARGV[i])
      local floor_r = math.min(floor * cap_r, cap_r - 1)
      local floor_t = math.min(floor * cap_t, cap_t - cost)
      if r - 1 >= floor_r - EPS and t - cost >= floor_t - EPS then
        r, t = r - 1, t - cost
        admitted = admitted + 1
      else
        wait = math.max(0, (1 + floor_r - r) / rate_r, (cost + floor_t - t) / rate_t)
        break
      end
    end
  end
elseif op == 'adjust' then
  r = math.min(cap_r, r + tonumber(ARGV[6]))
  t = math.min(cap_t, t + tonumber(ARGV[7]))
elseif op == 'drain' then
  r, t = math.min(r, 0), math.min(t, 0)
  bu = math.max(bu, now + tonumber(ARGV[6]))
elseif op == 'clamp' then
  if ARGV[6] ~= '' then r = math.min(r, tonumber(ARGV[6])) end
  if ARGV[7] ~= '' then t = math.min(t, tonumber(ARGV[7])) end
end

local blocked = math.max(0, bu - now)
if op ~= 'peek' then
  local fmt = '%.17g'
  redis.call('HSET', key, 'r', string.format(fmt, r), 't', string.format(fmt, t),
             'ts', string.format(fmt, now), 'bu', string.format(fmt, bu))
  -- Once both buckets would be full and no block is pending, the hash says nothing.
  local until_full = math.max((cap_r - r) / rate_r, (cap_t - t) / rate_t, blocked)
  redis.call('PEXPIRE', key, math.ceil(until_full * 1000) + 1000)
end
return {tostring(admitted), string.format('%.17g', wait), string.format('%.17g', r),
        string.format('%.17g', t), string.format('%.17g', blocked)}

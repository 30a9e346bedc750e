--[[
quotaflow's circuit breaker for one deployment, shared by every worker: a
run of failures opens it, a single probe is let through after the cooldown,
and a success closes it. Times are the Redis server's clock.

KEYS[1]  the deployment's hash, hash-tagged for Redis Cluster:
         "{quotaflow:cb:<deployment>}" with fields
           fails   failures in a row since the last success
           open    server time the circuit opened at (absent: closed)
           until   server time from which a probe may go (open + cooldown)
           probe   server time until which a probe is in flight (absent: none)
         A missing hash is a closed circuit with no failures. It expires an
         hour after its last failure.

ARGV[1]  op: "peek" | "probe" | "success" | "failure"
then, by op:
  peek     nothing: reports
  probe    ARGV[2] seconds a probe may take: claims the one probe of a
           half-open circuit; reply's first number is 1 when claimed
  success  nothing: closes the circuit and forgets the failures
  failure  ARGV[2] failures in a row that open it, ARGV[3] cooldown seconds.
           A failed probe opens it again for the cooldown; failures of calls
           that were in flight when it opened only count.
Every op returns one string, "claimed state wait_seconds fails", state being
0 closed, 1 open (wait = until a probe may go), 2 half-open with the probe
free, 3 half-open with a probe in flight (wait = until it times out).
]]

local key = KEYS[1]
local op = ARGV[1]
local t = redis.call("TIME")
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6

local fields = redis.call("HMGET", key, "fails", "open", "until", "probe")
local fails = tonumber(fields[1]) or 0
local opened = tonumber(fields[2])
local probe_from = tonumber(fields[3]) or 0
local probe = tonumber(fields[4]) or 0

local function state()
  if not opened then return 0, 0 end
  if now < probe_from then return 1, probe_from - now end
  if now < probe then return 3, probe - now end
  return 2, 0
end

local claimed = 0
if op == "probe" then
  local s = state()
  if s == 2 then
    probe = now + tonumber(ARGV[2])
    redis.call("HSET", key, "probe", probe)
    claimed = 1
  end
elseif op == "success" then
  redis.call("DEL", key)
  fails, opened, probe = 0, nil, 0
elseif op == "failure" then
  local threshold, cooldown = tonumber(ARGV[2]), tonumber(ARGV[3])
  fails = fails + 1
  local probing = opened and probe > 0
  if probing or (not opened and fails >= threshold) then
    opened, probe_from, probe = now, now + cooldown, 0
    redis.call("HSET", key, "open", opened, "until", probe_from, "probe", 0)
  end
  redis.call("HSET", key, "fails", fails)
  redis.call("EXPIRE", key, 3600)
end

local s, wait = state()
return string.format("%d %d %.6f %d", claimed, s, wait, fails)

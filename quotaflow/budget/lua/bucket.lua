--[[
quotaflow's cluster-wide limiter: two continuously refilling buckets
(requests and tokens) for one deployment, updated atomically on the Redis
server's clock, so every worker on every machine spends one budget.

KEYS[1]  the deployment's hash, hash-tagged for Redis Cluster:
         "{quotaflow:rl:<deployment>}" with fields
           r    requests in the bucket (float; below 0 after a debt)
           t    tokens in the bucket, unused reservations given back
                (float; below 0 after a debt)
           tn   tokens in the bucket, nothing given back
           v    mode 2's verdict, -4..1: refunds apply at 1 (see "clamp")
           u    tokens the provider can hold at most if it keeps reservations: full at
                creation, lowered by admissions only, never by a header or a block
           a    tokens admitted in all (a running total: "marks" on it date headers)
           g    tokens given back in all (refunds settled, a running total)
           ts   server time of the last update (seconds, float)
           bu   server time until which nothing is admitted (after a 429)
           ex   server time until which a caller was told the hash lives
           f:N  tokens admitted in time slot N and not yet settled
         Slot N = floor(server time / 10 s). A refund never lifts the tokens
         bucket above capacity minus the tokens still in flight: a provider whose
         bucket is nearly full loses part of a refund to its own ceiling. A slot
         older than the flight timeout is forgotten (its caller died).
         A missing hash is a full bucket; it expires once it would be full and no
         caller was told it lives longer.
         But a hash missing while a caller knows it must exist (ARGV[1] ends in
         "!": that caller wrote it, and it had not yet expired) was lost (Redis
         restarted empty, failed over, was flushed or evicted it): it is created
         empty, as the provider's own may be spent, and refills from there.
         Admission spends from t where the provider gives back the unused part
         of max_tokens after a call, from tn where it keeps it (mode 1 and 0),
         and in mode 2 from t once the provider's x-ratelimit-remaining-tokens
         headers have proved that it gives back (v = 1), from tn until then.

ARGV[1]  op: "acquire" | "settle" | "drain" | "clamp" | "peek", with a "!" after it when
         the caller knows the hash exists (see "A missing hash" above)
ARGV[2]  the budget, six numbers separated by spaces: requests refill rate per
         second, requests capacity, tokens refill rate per second, tokens capacity,
         flight timeout in seconds (the longest a call can be in flight), refund
         mode (0 never, 1 always, 2 learned from the headers); or eight, the last two
         an input-tokens bucket's refill rate and capacity: a "split" budget
         (Anthropic's ITPM beside OTPM). There the tokens bucket (t, tn, votes, marks)
         holds output tokens, max_tokens reserved and refunded as the mode says, and
         field i holds input tokens (g:N: input tokens in flight per slot), whose
         estimate is corrected both ways at settle: the provider counts the prompt it
         received, not the estimate.
         Then, after " ; ", any number of caps (a tenant's, a job's --rpm/--tpm), four
         numbers each: requests rate and capacity, tokens rate and capacity (0: not
         capped); KEYS[1 + n] is cap n's hash, "{quotaflow:rl:<deployment>}:cap:<scope>"
         (the same slot), fields r, t, tn and ts as above. A cap refills as the
         deployment does, spends from t or tn as the deployment does, and takes the
         deployment's input and output tokens together. Acquire admits a request only
         if it fits the deployment and every cap, all-or-nothing: a cap that refuses
         takes nothing from the deployment. Settle gives refunds back to the caps as to
         the deployment (no ceiling but their capacity: quotaflow's own buckets).
then, by op:
  acquire  ARGV[3] floor fraction (0..1), ARGV[4] safety margin (seconds of refill),
           ARGV[5..] token costs of k requests in order (split: k output costs,
           then the k requests' input costs).
           Admits the longest prefix that fits above floor + margin, all-or-nothing
           per request over both buckets. The floor never exceeds capacity - cost, so
           a large request still fits a full bucket. The margin is the refill a
           provider's full bucket loses while a request travels to it.
           -> admitted, wait_seconds_for_the_next, ...
  settle   four numbers per finished call, ARGV[3..]: the slot it was admitted in, its
           admitted cost, its unused estimate (< 0 for a debt), and 1 if it was
           answered, 0 if it failed without an answer (the provider may not have
           counted it: its cost goes back to u), - if it was never sent (stale or
           fenced off: its request goes back to r and its unused estimate, all of
           it, to tn as well as t); split: six, the four then the input
           cost and its unused estimate. A refund goes to t
           only, a debt to both. A worker settles a chunk of calls at once: one round
           trip, not one per call.
  drain    ARGV[3] seconds: empty both buckets and admit nothing for that long;
           they start refilling, from empty, when the block ends
  pause    ARGV[3] seconds: admit nothing for that long, the buckets as they are and
           refilling meanwhile (a 429 that is not the budget running out: the
           provider's Retry-After, no more; a pause never extends another)
  clamp    ARGV[3] requests remaining, ARGV[4] tokens remaining ("" = unknown), then
           what dates them, from the admission of the call that carried them ("" =
           undated: no verdict): ARGV[5] its mark (a with it counted), ARGV[6] the
           tokens in flight then, ARGV[7] the server time then, ARGV[8] g then.
           Lower the buckets to what the provider reports, never raise them (t
           only while refunds are not applied: an older header would undo a newer
           refund). In mode 2 the tokens figure first gives a verdict, from bounds
           that no timing can break (no worker's clock, no slack for lateness):
           a provider that keeps reservations holds at most u plus what it may not
           have counted yet (the tokens in flight at the call's admission, and
           those admitted since): more than that proves refunds (v + 1). One that
           gives back holds at least t less the refill and the refunds since the
           call's admission (the header cannot be older): less than that
           contradicts them, and refunds stop at once (v = min(v, 0) - 1: the
           next switch needs one more proof per contradiction).
           Split: ARGV[9] input tokens remaining lowers i.
  peek     refills and reports; writes nothing
Every op returns one string, "admitted wait_seconds r t blocked_seconds slot
tokens_in_flight refunding mark now g keep_seconds" (split: then i; with caps: then 1 if
a cap refused the next request, else 0, and each cap's requests and spendable tokens): one
bulk reply is cheaper to parse than twelve. t is the level admission spends from; mark is a's value
before this admission; now the server's time; keep_seconds how long the hash now lives
at least (0: not written): a write never shortens it.
--]]

local key = KEYS[1]
local op, known = string.match(ARGV[1], '^(%a+)(!?)$')
local budget, caps = {}, {}
local packed, capped = ARGV[2], 0
local first_cap = string.find(packed, ';', 1, true)
if first_cap then packed = string.sub(ARGV[2], 1, first_cap - 1) end
for number in string.gmatch(packed, '%S+') do table.insert(budget, tonumber(number)) end
if first_cap then
  for part in string.gmatch(string.sub(ARGV[2], first_cap + 1), '[^;]+') do
    local n = {}
    for number in string.gmatch(part, '%S+') do table.insert(n, tonumber(number)) end
    table.insert(caps, {key = KEYS[#caps + 2], rate_r = n[1], cap_r = n[2], rate_t = n[3],
                        cap_t = n[4]})
  end
end
local rate_r, cap_r, rate_t, cap_t, flight_timeout, mode, rate_i, cap_i = unpack(budget)
local split = rate_i ~= nil
local SLOT_S, EPS = 10, 1e-9
-- Contradictions of refunds count down to -VOTES; refunds apply at 1 (mode 2).
local VOTES = 4
local fmt = '%.17g'

local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local slot = math.floor(now / SLOT_S)
local oldest = slot - math.ceil(flight_timeout / SLOT_S)

local fields = redis.call('HGETALL', key)
local state, f, fi, stale = {}, 0, 0, {}
for i = 1, #fields, 2 do
  local name, value = fields[i], tonumber(fields[i + 1])
  local n = string.match(name, '^f:(%d+)$')
  local g = not n and split and string.match(name, '^g:(%d+)$')
  if g then
    if tonumber(g) < oldest then table.insert(stale, name) else fi = fi + value end
  elseif not n then
    state[name] = value
  elseif tonumber(n) < oldest then
    table.insert(stale, name)
  else
    f = f + value
  end
end

-- A hash its caller knows must exist was lost: empty, not full.
local lost = known == '!' and #fields == 0
local full = lost and 0 or nil
local r = state.r or full or cap_r
local t = state.t or full or cap_t
local tn = state.tn or t
local u = state.u or cap_t
local v = state.v or 0
local a = state.a or 0
local g = state.g or 0
local mark = a
local ts = state.ts or now
local bu = state.bu or 0
local pu = state.pu or 0
-- Nothing refills while a 429 block lasts: the bucket is empty when it ends.
local elapsed = math.max(0, now - math.max(ts, bu))
-- u refills through blocks too: it bounds the provider's level from above.
u = math.min(cap_t, u + math.max(0, now - ts) * rate_t)
r = math.min(cap_r, r + elapsed * rate_r)
t = math.min(cap_t, t + elapsed * rate_t)
tn = math.min(cap_t, tn + elapsed * rate_t)
local inp = 0
if split then inp = math.min(cap_i, (state.i or full or cap_i) + elapsed * rate_i) end
local function refunding()
  return mode == 1 or (mode == 2 and v >= 1)
end
for _, cap in ipairs(caps) do
  local got = redis.call('HMGET', cap.key, 'r', 't', 'tn', 'ts')
  local since = math.max(0, now - (tonumber(got[4]) or now))
  cap.r = math.min(cap.cap_r, (tonumber(got[1]) or cap.cap_r) + since * cap.rate_r)
  cap.t = math.min(cap.cap_t, (tonumber(got[2]) or cap.cap_t) + since * cap.rate_t)
  cap.tn = math.min(cap.cap_t, (tonumber(got[3]) or tonumber(got[2]) or cap.cap_t)
                    + since * cap.rate_t)
end
-- The wait until every cap takes one more request of `cost` tokens (0: they all do now).
local function cap_wait(cost, spend_from_t)
  local w = 0
  for _, cap in ipairs(caps) do
    local level = spend_from_t and cap.t or cap.tn
    if cap.cap_r > 0 and cap.r - 1 < -EPS then w = math.max(w, (1 - cap.r) / cap.rate_r) end
    if cap.cap_t > 0 and level - cost < -EPS then
      w = math.max(w, (cost - level) / cap.rate_t)
    end
  end
  return w
end
-- A refund (< 0: a debt) to every cap: to t, to tn as well where `both`.
local function cap_refund(refund, both)
  for _, cap in ipairs(caps) do
    if refund < 0 then
      cap.t, cap.tn = cap.t + refund, cap.tn + refund
    else
      cap.t = math.max(cap.t, math.min(cap.t + refund, cap.cap_t))
      if both then cap.tn = math.max(cap.tn, math.min(cap.tn + refund, cap.cap_t)) end
    end
  end
end
local function write_caps()
  for _, cap in ipairs(caps) do
    local full = 0
    if cap.cap_r > 0 then full = math.max(full, (cap.cap_r - cap.r) / cap.rate_r) end
    if cap.cap_t > 0 then
      full = math.max(full, (cap.cap_t - math.min(cap.t, cap.tn)) / cap.rate_t)
    end
    redis.call('HSET', cap.key, 'r', string.format(fmt, cap.r), 't', string.format(fmt, cap.t),
               'tn', string.format(fmt, cap.tn), 'ts', string.format(fmt, now))
    redis.call('PEXPIRE', cap.key, math.ceil(full * 1000) + 1000)
  end
end

local admitted, wait = 0, 0

if op == 'acquire' then
  local floor, margin = tonumber(ARGV[3]), tonumber(ARGV[4])
  local cost_total, input_total = 0, 0
  if now < math.max(bu, pu) then
    wait = math.max(bu, pu) - now
  else
    local spend_from_t = refunding()
    local k = #ARGV - 4
    if split then k = k / 2 end
    for j = 5, 4 + k do
      local cost = tonumber(ARGV[j])
      local level = spend_from_t and t or tn
      local floor_r = math.min(floor * cap_r + margin * rate_r, cap_r - 1)
      local floor_t = math.min(floor * cap_t + margin * rate_t, cap_t - cost)
      local fits = r - 1 >= floor_r - EPS and level - cost >= floor_t - EPS
      local cost_i, floor_i = 0, 0
      if split then
        cost_i = tonumber(ARGV[j + k])
        floor_i = math.min(floor * cap_i + margin * rate_i, cap_i - cost_i)
        fits = fits and inp - cost_i >= floor_i - EPS
      end
      local held = #caps > 0 and cap_wait(cost + cost_i, spend_from_t) or 0
      if fits and held == 0 then
        for _, cap in ipairs(caps) do
          if cap.cap_r > 0 then cap.r = cap.r - 1 end
          if cap.cap_t > 0 then
            cap.t = cap.t - cost - cost_i
            cap.tn = math.max(math.min(cap.tn, 0), cap.tn - cost - cost_i)
          end
        end
        -- Spending from t, tn stops at 0: a provider that keeps reservations
        -- refuses below 0 rather than going there, and tn must stay its picture.
        r, t, tn = r - 1, t - cost, math.max(math.min(tn, 0), tn - cost)
        u = math.max(-cap_t, u - cost)
        inp = inp - cost_i
        admitted, cost_total = admitted + 1, cost_total + cost
        input_total = input_total + cost_i
      else
        if not fits then
          wait = math.max(0, (1 + floor_r - r) / rate_r, (cost + floor_t - level) / rate_t)
          if split then wait = math.max(wait, (cost_i + floor_i - inp) / rate_i) end
        end
        if held > 0 then wait, capped = math.max(wait, held), 1 end
        break
      end
    end
  end
  if admitted > 0 then
    write_caps()
    redis.call('HINCRBYFLOAT', key, 'f:' .. slot, cost_total)
    f = f + cost_total
    a = a + cost_total
    if input_total > 0 then
      redis.call('HINCRBYFLOAT', key, 'g:' .. slot, input_total)
      fi = fi + input_total
    end
  end
elseif op == 'settle' then
  local step = split and 6 or 4
  for i = 3, #ARGV - step + 1, step do
    local at, cost, refund = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
    -- Failed without an answer: the provider may never have counted it.
    if ARGV[i + 3] ~= '1' then u = math.min(cap_t, u + cost) end
    if tonumber(at) >= oldest and cost > 0 then
      local left = tonumber(redis.call('HINCRBYFLOAT', key, 'f:' .. at, -cost))
      if left <= EPS then redis.call('HDEL', key, 'f:' .. at) end
      f = math.max(0, f - cost - math.min(0, left))
    end
    -- Never sent: the provider cannot have counted it, in either mode.
    if ARGV[i + 3] == '-' then
      r = math.min(cap_r, r + 1)
      tn = math.max(tn, math.min(tn + refund, cap_t - f))
      for _, cap in ipairs(caps) do cap.r = math.min(cap.cap_r, cap.r + 1) end
    end
    if #caps > 0 then
      cap_refund(refund, ARGV[i + 3] == '-')
      -- Input tokens are corrected both ways, whatever the mode (as i is).
      if split then cap_refund(tonumber(ARGV[i + 5]), true) end
    end
    if refund < 0 then
      t, tn = t + refund, tn + refund
    else
      local was = t
      t = math.max(t, math.min(t + refund, cap_t - f))
      g = g + (t - was)
    end
    if split then
      local cost_i, refund_i = tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5])
      if tonumber(at) >= oldest and cost_i > 0 then
        local left = tonumber(redis.call('HINCRBYFLOAT', key, 'g:' .. at, -cost_i))
        if left <= EPS then redis.call('HDEL', key, 'g:' .. at) end
        fi = math.max(0, fi - cost_i - math.min(0, left))
      end
      if refund_i < 0 then
        inp = inp + refund_i
      else
        inp = math.max(inp, math.min(inp + refund_i, cap_i - fi))
      end
    end
  end
  write_caps()
elseif op == 'drain' then
  r, t, tn, inp = math.min(r, 0), math.min(t, 0), math.min(tn, 0), math.min(inp, 0)
  bu = math.max(bu, now + tonumber(ARGV[3]))
elseif op == 'pause' then
  pu = math.max(pu, now + tonumber(ARGV[3]))
elseif op == 'clamp' then
  if ARGV[3] ~= '' then r = math.min(r, tonumber(ARGV[3])) end
  if ARGV[4] ~= '' then
    local seen, since = tonumber(ARGV[4]), tonumber(ARGV[5])
    local flying, at, given = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
    if mode == 2 and since and flying and at and given and since <= a + EPS then
      -- A contradiction outweighs a proof: the safe side wins.
      if v >= 1 and seen + math.max(0, now - at) * rate_t + math.max(0, g - given) + 1 < t then
        v = math.max(-VOTES, math.min(v, 0) - 1)
      elseif seen > u + flying + (a - since) + 1 then
        v = math.min(1, v + 1)
      end
    end
    tn = math.min(tn, seen)
    if not refunding() then t = math.min(t, seen) end
  end
  if split and ARGV[9] and ARGV[9] ~= '' then inp = math.min(inp, tonumber(ARGV[9])) end
end

local blocked = math.max(0, bu - now, pu - now)
local keep = 0
if op ~= 'peek' then
  if #stale > 0 then redis.call('HDEL', key, unpack(stale)) end
  -- Keep the hash while calls are in flight, a block lasts, or it is not yet full; and
  -- never less long than a caller was last told (ex): found gone before then, it would
  -- read as lost data and start empty.
  keep = math.max((cap_r - r) / rate_r, (cap_t - math.min(t, tn)) / rate_t, blocked,
                  (state.ex or 0) - now)
  if split then keep = math.max(keep, (cap_i - inp) / rate_i) end
  if f > EPS or fi > EPS then keep = math.max(keep, flight_timeout + SLOT_S) end
  redis.call('HSET', key, 'r', string.format(fmt, r), 't', string.format(fmt, t),
             'tn', string.format(fmt, tn), 'v', v, 'a', string.format(fmt, a),
             'u', string.format(fmt, u), 'g', string.format(fmt, g),
             'ts', string.format(fmt, now),
             'bu', string.format(fmt, bu), 'pu', string.format(fmt, pu),
             'ex', string.format(fmt, now + keep))
  if split then redis.call('HSET', key, 'i', string.format(fmt, inp)) end
  redis.call('PEXPIRE', key, math.ceil(keep * 1000) + 1000)
end
local spending = refunding()
local reply = string.format('%d %.17g %.17g %.17g %.17g %d %.17g %d %.17g %.17g %.17g %.17g',
                            admitted, wait, r, spending and t or tn, blocked, slot, f,
                            spending and 1 or 0, mark, now, g, keep)
if split then reply = reply .. string.format(' %.17g', inp) end
if #caps > 0 then
  reply = reply .. ' ' .. capped
  for _, cap in ipairs(caps) do
    reply = reply .. string.format(' %.17g %.17g', cap.r, spending and cap.t or cap.tn)
  end
end
return reply

"""The two limiters: `RedisLimiter` runs quotaflow/budget/lua/bucket.lua, one call per
operation on the Redis server's clock, shared by every worker on every machine;
`LocalLimiter` is the same arithmetic in Python for `quotaflow run` without Redis.
Both pass the suite of tests/unit/budget/test_ratelimit.py (tests/cluster/ runs it on Redis).
"""

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from quotaflow.budget.caps import LocalCaps, cap_key, held_for
from quotaflow.budget.limiter import Admission, Dating, Levels, Limiter, Settlement
from quotaflow.constants import REDIS_PREFIX
from quotaflow.deployments.limits import Budget, Refunds
from quotaflow.errors import ServiceUnavailable
from quotaflow.redis_clients import UNREACHABLE, connect
from quotaflow.redis_scripts import load_script

SCRIPT = Path(__file__).with_name("lua") / "bucket.lua"
EPS = 1e-9
SLOT_S = 10  # calls in flight are tallied per 10 s slot of admission time
# Learning refunds (bucket.lua's mode 2): refunds apply at verdict 1; contradictions
# count down to -VOTES, each needing one more proof to switch again.
VOTES = 4
# A hash is known to exist until the expiry the script last gave it, less this much
# (the script keeps it a second longer; clocks of client and server tick apart).
KNOWN_MARGIN_S = 0.5


def bucket_key(name: str) -> str:
    """The deployment's hash; the braces keep it in one Redis Cluster slot."""
    return f"{{{REDIS_PREFIX}:rl:{name}}}"


class RedisLimiter:
    """The shared limiter: one Lua call per operation, exact across processes and machines."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._redis = connect(url, socket_timeout=5, socket_connect_timeout=5)
        self._script = load_script(self._redis, SCRIPT.read_text())
        # Per budget, until when (monotonic) this process knows its hash exists: it wrote
        # it, with an expiry not yet passed. Found missing before then, it was lost.
        self._known_until: dict[str, float] = {}

    def _call(self, budget: Budget, op: str, *extra: str) -> list[float]:
        started = time.monotonic()
        known = started < self._known_until.get(budget.name, 0.0)
        keys = [bucket_key(budget.name)]
        if budget.caps:
            keys += [cap_key(budget.name, cap.scope) for cap in budget.caps]
        try:
            reply = self._script(keys=keys, args=[op + "!" if known else op, budget.packed,
                                                  *extra])
        except UNREACHABLE as exc:
            raise ServiceUnavailable(
                f"the limiter's Redis is unreachable ({exc.__class__.__name__}); check "
                "QUOTAFLOW_REDIS_URL and that Redis is running — work waits until it is back"
            ) from exc
        numbers = [float(value) for value in reply.split()]
        if numbers[11] > 0:  # keep_seconds: the hash was written, and lives that long
            self._known_until[budget.name] = started + numbers[11] - KNOWN_MARGIN_S
        return numbers

    def acquire(self, budget: Budget, costs: Sequence[int], floor: float,
                input_costs: Sequence[int] = ()) -> Admission:
        numbers = self._call(budget, "acquire", repr(floor), repr(budget.margin_s),
                             *map(str, costs), *map(str, input_costs))
        admitted, wait, _, _, _, slot, flying, refunding, mark, at, refunded = numbers[:11]
        capped = bool(budget.caps) and numbers[13 if budget.split else 12] > 0
        return Admission(int(admitted), wait, int(slot), flying, bool(refunding), mark, at,
                         refunded, capped)

    def settle(self, budget: Budget, settlements: Sequence[Settlement]) -> None:
        if not settlements:
            return
        if budget.split:
            self._call(budget, "settle", *(part for s in settlements for part in (
                str(s.slot), str(s.cost), repr(float(s.refund)), s.state,
                str(s.input_cost), repr(float(s.input_refund)))))
            return
        self._call(budget, "settle", *(part for s in settlements for part in (
            str(s.slot), str(s.cost), repr(float(s.refund)), s.state)))

    def drain(self, budget: Budget, seconds: float) -> None:
        self._call(budget, "drain", repr(float(seconds)))

    def pause(self, budget: Budget, seconds: float) -> None:
        self._call(budget, "pause", repr(float(seconds)))

    def clamp(self, budget: Budget, requests: float | None, tokens: float | None,
              dating: Dating | None = None, inputs: float | None = None) -> None:
        extra = ("" if inputs is None else repr(float(inputs)),) if budget.split else ()
        dated = (("", "", "", "") if dating is None else
                 tuple(repr(float(n)) for n in (dating.mark, dating.flying, dating.at,
                                                dating.refunded)))
        self._call(budget, "clamp", "" if requests is None else repr(float(requests)),
                   "" if tokens is None else repr(float(tokens)), *dated, *extra)

    def levels(self, budget: Budget) -> Levels:
        _, _, r, t, blocked, _, _, refunding, _, _, _, _, *rest = self._call(budget, "peek")
        inputs = rest.pop(0) if budget.split else None
        caps = tuple(zip(rest[1::2], rest[2::2], strict=True)) if budget.caps else ()
        return Levels(r, t, blocked, bool(refunding), inputs, caps)

    def close(self) -> None:
        self._redis.close()


@dataclass
class _State:
    r: float
    t: float  # tokens, unused reservations given back
    ts: float
    tn: float = math.nan  # tokens, nothing given back
    v: int = 0  # the refund verdict: refunds apply at 1 (bucket.lua's "clamp")
    a: float = 0.0  # tokens admitted in all: marks on it date headers
    g: float = 0.0  # tokens given back in all
    u: float = math.nan  # the most a provider that keeps reservations can hold
    bu: float = 0.0  # blocked until: a drain, no refill meanwhile
    pu: float = 0.0  # paused until: no admission, the buckets refilling
    i: float = math.inf  # a split budget's input tokens (inf: it has no input bucket)
    # slot -> [requests, tokens, input tokens]
    flights: dict[int, list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if math.isnan(self.tn):
            self.tn = self.t
        if math.isnan(self.u):
            self.u = self.t

    def refunding(self, budget: Budget) -> bool:
        return budget.refunds == Refunds.ALWAYS or (
            budget.refunds == Refunds.LEARNED and self.v >= 1)

    def level(self, budget: Budget) -> float:
        """The tokens admission spends from."""
        return self.t if self.refunding(budget) else self.tn


class LocalLimiter:
    """The in-process twin of bucket.lua, for one process with no Redis."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._states: dict[str, _State] = {}
        self._caps = LocalCaps()

    def _refilled(self, budget: Budget) -> tuple[_State, float, int]:
        now = self._clock()
        slot = math.floor(now / SLOT_S)
        state = self._states.get(budget.name)
        if state is None:
            state = self._states[budget.name] = _State(
                budget.request_capacity, budget.token_capacity, now,
                i=budget.input_capacity if budget.split else math.inf)
        oldest = slot - math.ceil(budget.flight_timeout_s / SLOT_S)
        for stale in [n for n in state.flights if n < oldest]:
            del state.flights[stale]
        # u bounds the provider from above: it refills through a 429 block too.
        state.u = min(budget.token_capacity, state.u + max(0.0, now - state.ts)
                      * budget.token_rate)
        elapsed = max(0.0, now - max(state.ts, state.bu))  # no refill during a 429 block
        state.r = min(budget.request_capacity, state.r + elapsed * budget.request_rate)
        state.t = min(budget.token_capacity, state.t + elapsed * budget.token_rate)
        state.tn = min(budget.token_capacity, state.tn + elapsed * budget.token_rate)
        if budget.split:
            state.i = min(budget.input_capacity, state.i + elapsed * budget.input_rate)
        state.ts = now
        return state, now, slot

    @staticmethod
    def _in_flight(state: _State) -> tuple[float, float]:
        return (sum(f[0] for f in state.flights.values()),
                sum(f[1] for f in state.flights.values()))

    def acquire(self, budget: Budget, costs: Sequence[int], floor: float,
                input_costs: Sequence[int] = ()) -> Admission:
        with self._lock:
            state, now, slot = self._refilled(budget)
            refunding = state.refunding(budget)
            if now < max(state.bu, state.pu):
                return Admission(0, max(state.bu, state.pu) - now, slot,
                                 self._in_flight(state)[1], refunding, state.a, now, state.g)
            admitted, total, total_i, wait, capped = 0, 0, 0, 0.0, False
            caps = self._caps.refilled(budget, now) if budget.caps else ()
            for n, cost in enumerate(costs):
                level = state.t if refunding else state.tn
                cost_i = input_costs[n] if budget.split else 0
                floor_i = (min(floor * budget.input_capacity + budget.margin_s
                               * budget.input_rate, budget.input_capacity - cost_i)
                           if budget.split else 0.0)
                floor_r = min(floor * budget.request_capacity
                              + budget.margin_s * budget.request_rate,
                              budget.request_capacity - 1)
                floor_t = min(floor * budget.token_capacity + budget.margin_s * budget.token_rate,
                              budget.token_capacity - cost)
                held = held_for(caps, cost + cost_i, refunding)
                if (state.r - 1 < floor_r - EPS or level - cost < floor_t - EPS
                        or (budget.split and state.i - cost_i < floor_i - EPS)):
                    wait = max(0.0, (1 + floor_r - state.r) / budget.request_rate,
                               (cost + floor_t - level) / budget.token_rate, held)
                    if budget.split:
                        wait = max(wait, (cost_i + floor_i - state.i) / budget.input_rate)
                    capped = held > 0
                    break
                if held > 0:
                    wait, capped = held, True
                    break
                for cap in caps:
                    cap.take(cost + cost_i)
                state.r -= 1
                state.t -= cost
                state.tn = max(min(state.tn, 0.0), state.tn - cost)
                state.u = max(-budget.token_capacity, state.u - cost)
                state.i -= cost_i
                admitted, total, total_i = admitted + 1, total + cost, total_i + cost_i
            mark = state.a
            if admitted:
                flight = state.flights.setdefault(slot, [0.0, 0.0, 0.0])
                flight[0] += admitted
                flight[1] += total
                flight[2] += total_i
                state.a += total
            return Admission(admitted, wait, slot, self._in_flight(state)[1], refunding, mark,
                             now, state.g, capped)

    def settle(self, budget: Budget, settlements: Sequence[Settlement]) -> None:
        with self._lock:
            state, now, _ = self._refilled(budget)
            caps = self._caps.refilled(budget, now) if budget.caps else ()
            for settlement in settlements:
                slot, cost, refund = settlement.slot, settlement.cost, settlement.refund
                if slot in state.flights:
                    flight = state.flights[slot]
                    flight[0] -= 1
                    flight[1] -= cost
                    flight[2] -= settlement.input_cost
                    if flight[0] <= EPS:
                        del state.flights[slot]
                _, f = self._in_flight(state)
                if not settlement.answered:  # maybe never counted: u stays an upper bound
                    state.u = min(budget.token_capacity, state.u + cost)
                if not settlement.sent:  # never counted: its request and tokens back
                    state.r = min(budget.request_capacity, state.r + 1)
                    state.tn = max(state.tn, min(state.tn + refund, budget.token_capacity - f))
                if refund < 0:
                    state.t += refund
                    state.tn += refund
                else:
                    was = state.t
                    state.t = max(state.t, min(state.t + refund, budget.token_capacity - f))
                    state.g += state.t - was
                if budget.split:
                    self._settle_input(budget, state, settlement.input_refund)
                for cap in caps:
                    if not settlement.sent:
                        cap.r = min(cap.capacity_r, cap.r + 1)
                    cap.refund(refund, not settlement.sent)
                    if budget.split:
                        cap.refund(settlement.input_refund, True)

    @staticmethod
    def _settle_input(budget: Budget, state: _State, refund: float) -> None:
        """The provider counted the prompt it got, not the estimate: both ways."""
        if refund < 0:
            state.i += refund
        else:
            held = sum(f[2] for f in state.flights.values())
            state.i = max(state.i, min(state.i + refund, budget.input_capacity - held))

    def drain(self, budget: Budget, seconds: float) -> None:
        with self._lock:
            state, now, _ = self._refilled(budget)
            state.r, state.t, state.tn = min(state.r, 0.0), min(state.t, 0.0), min(state.tn, 0.0)
            state.i = min(state.i, 0.0)
            state.bu = max(state.bu, now + seconds)

    def pause(self, budget: Budget, seconds: float) -> None:
        with self._lock:
            state, now, _ = self._refilled(budget)
            state.pu = max(state.pu, now + seconds)

    def clamp(self, budget: Budget, requests: float | None, tokens: float | None,
              dating: Dating | None = None, inputs: float | None = None) -> None:
        with self._lock:
            state, now, _ = self._refilled(budget)
            if requests is not None:
                state.r = min(state.r, requests)
            if inputs is not None and budget.split:
                state.i = min(state.i, inputs)
            if tokens is None:
                return
            if (budget.refunds == Refunds.LEARNED and dating is not None
                    and dating.mark <= state.a + EPS):
                # A contradiction outweighs a proof: the safe side wins.
                if state.v >= 1 and tokens + max(0.0, now - dating.at) * budget.token_rate \
                        + max(0.0, state.g - dating.refunded) + 1 < state.t:
                    state.v = max(-VOTES, min(state.v, 0) - 1)  # less than giving back would
                elif tokens > state.u + dating.flying + (state.a - dating.mark) + 1:
                    state.v = min(1, state.v + 1)  # more than keeping could leave
            state.tn = min(state.tn, tokens)
            if not state.refunding(budget):
                state.t = min(state.t, tokens)

    def levels(self, budget: Budget) -> Levels:
        with self._lock:
            state, now, _ = self._refilled(budget)
            refunding = state.refunding(budget)
            caps = tuple((cap.r, cap.t if refunding else cap.tn)
                         for cap in self._caps.refilled(budget, now))
            return Levels(state.r, state.level(budget), max(0.0, state.bu - now, state.pu - now),
                          refunding, state.i if budget.split else None, caps)


def make_limiter(settings_url: str | None) -> Limiter:
    """The shared Redis limiter when a Redis URL is configured, else the in-process twin."""
    return RedisLimiter(settings_url) if settings_url else LocalLimiter()

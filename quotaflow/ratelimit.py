"""The cluster-wide RPM/TPM limiter, and its in-process twin for the embedded mode.

Each deployment has two continuously refilling buckets, requests and tokens,
with capacity = limit x burst_seconds / 60. Acquire is all-or-nothing over
both and answers "k admitted" plus the exact wait until the next would fit.
Queues keep floors: realtime may empty a bucket, standard and bulk stop at
their floor, so realtime always finds headroom while bulk still gets the
whole refill rate. Provider feedback (429, x-ratelimit-remaining-*) drains
or clamps the buckets for everyone.

`RedisLimiter` runs quotaflow/lua/bucket.lua, one call per operation, on
the Redis server's clock. `LocalLimiter` is the same arithmetic in Python
for `quotaflow run` without Redis. Both pass tests/test_ratelimit.py.
"""

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Protocol

import redis

from quotaflow.config import Deployment
from quotaflow.constants import REDIS_PREFIX
from quotaflow.errors import QuotaflowError, ServiceUnavailable

SCRIPT = Path(__file__).with_name("lua") / "bucket.lua"
EPS = 1e-9
SLOT_S = 10  # calls in flight are tallied per 10 s slot of admission time


class RequestTooLarge(QuotaflowError):
    """The request costs more tokens than the deployment's bucket can ever hold."""


@dataclass(frozen=True)
class Budget:
    """One deployment's limits, as the buckets see them."""

    name: str
    rpm: float
    tpm: float
    burst_seconds: float = 60.0
    # The longest a call can be in flight; an unsettled admission older than
    # this is forgotten (its worker died).
    flight_timeout_s: float = 300.0
    # Refill kept in hand at admission: a provider whose bucket is full loses the
    # refill of the time a request spends travelling to it (design.md, the limiter).
    margin_s: float = 0.0

    @classmethod
    def of(cls, deployment: Deployment) -> "Budget":
        return cls(deployment.budget_name, deployment.rpm, deployment.tpm, deployment.burst_seconds,
                   flight_timeout_s=4 * deployment.timeout_s + 60,
                   margin_s=deployment.safety_margin_s)

    @property
    def request_rate(self) -> float:
        return self.rpm / 60

    @property
    def token_rate(self) -> float:
        return self.tpm / 60

    @property
    def request_capacity(self) -> float:
        return self.rpm * self.burst_seconds / 60

    @property
    def token_capacity(self) -> float:
        return self.tpm * self.burst_seconds / 60

    def check_fits(self, cost: int) -> None:
        if cost > self.token_capacity:
            raise RequestTooLarge(
                f"the request needs {cost} tokens (prompt estimate + max_tokens) but deployment "
                f"{self.name!r} admits at most {self.token_capacity:.0f} at once "
                f"(tpm {self.tpm:g} x burst_seconds {self.burst_seconds:g} / 60); "
                "lower max_tokens or shorten the prompt")

    @cached_property
    def packed(self) -> str:
        """The budget as bucket.lua's ARGV[2] reads it, built once."""
        return " ".join(repr(float(n)) for n in (
            self.request_rate, self.request_capacity, self.token_rate, self.token_capacity,
            self.flight_timeout_s))


@dataclass(frozen=True)
class Admission:
    """How many of the requests asked for were admitted, and the wait before the next fits.

    `slot` identifies the admission when it is settled; `tokens_in_flight` are
    admitted and unsettled, i.e. refunds that may yet shorten the wait.
    """

    admitted: int
    wait_s: float
    slot: int = 0
    tokens_in_flight: float = 0.0


@dataclass(frozen=True, slots=True)
class Settlement:
    """One finished call: the slot it was admitted in, its admitted cost, and the tokens
    to give back (its unused estimate; negative for a debt; 0 where not reconciled)."""

    slot: int
    cost: int
    refund: float


@dataclass(frozen=True)
class Levels:
    """A bucket pair's content right now."""

    requests: float
    tokens: float
    blocked_s: float

    def utilisation(self, budget: Budget) -> float:
        """The used share of the fuller-used bucket: max(rpm use, tpm use), 0..1."""
        used_r = 1 - self.requests / budget.request_capacity
        used_t = 1 - self.tokens / budget.token_capacity
        return min(1.0, max(0.0, used_r, used_t))


class Limiter(Protocol):
    """What the executor needs from a limiter; Redis and in-process versions agree."""

    def acquire(self, budget: Budget, costs: Sequence[int], floor: float) -> Admission: ...

    def settle(self, budget: Budget, settlements: Sequence[Settlement]) -> None:
        """Close admitted calls: no longer in flight; refund their unused tokens."""

    def drain(self, budget: Budget, seconds: float) -> None: ...

    def pause(self, budget: Budget, seconds: float) -> None: ...

    def clamp(self, budget: Budget, requests: float | None, tokens: float | None) -> None: ...

    def levels(self, budget: Budget) -> Levels: ...


def bucket_key(name: str) -> str:
    """The deployment's hash; the braces keep it in one Redis Cluster slot."""
    return f"{{{REDIS_PREFIX}:rl:{name}}}"


class RedisLimiter:
    """The shared limiter: one Lua call per operation, exact across processes and machines."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._redis = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        self._script = self._redis.register_script(SCRIPT.read_text())

    def _call(self, budget: Budget, op: str, *extra: str) -> list[float]:
        try:
            reply = self._script(keys=[bucket_key(budget.name)], args=[op, budget.packed, *extra])
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise ServiceUnavailable(
                f"the limiter's Redis is unreachable ({exc.__class__.__name__}); check "
                "QUOTAFLOW_REDIS_URL and that Redis is running — work waits until it is back"
            ) from exc
        return [float(value) for value in reply.split()]

    def acquire(self, budget: Budget, costs: Sequence[int], floor: float) -> Admission:
        admitted, wait, _, _, _, slot, flying = self._call(
            budget, "acquire", repr(floor), repr(budget.margin_s), *map(str, costs))
        return Admission(int(admitted), wait, int(slot), flying)

    def settle(self, budget: Budget, settlements: Sequence[Settlement]) -> None:
        if settlements:
            self._call(budget, "settle", *(part for s in settlements for part in (
                str(s.slot), str(s.cost), repr(float(s.refund)))))

    def drain(self, budget: Budget, seconds: float) -> None:
        self._call(budget, "drain", repr(float(seconds)))

    def pause(self, budget: Budget, seconds: float) -> None:
        self._call(budget, "pause", repr(float(seconds)))

    def clamp(self, budget: Budget, requests: float | None, tokens: float | None) -> None:
        self._call(budget, "clamp", "" if requests is None else repr(float(requests)),
                   "" if tokens is None else repr(float(tokens)))

    def levels(self, budget: Budget) -> Levels:
        _, _, r, t, blocked, _, _ = self._call(budget, "peek")
        return Levels(r, t, blocked)

    def close(self) -> None:
        self._redis.close()


@dataclass
class _State:
    r: float
    t: float
    ts: float
    bu: float = 0.0  # blocked until: a drain, no refill meanwhile
    pu: float = 0.0  # paused until: no admission, the buckets refilling
    flights: dict[int, list[float]] = field(default_factory=dict)  # slot -> [requests, tokens]


class LocalLimiter:
    """The in-process twin of bucket.lua, for one process with no Redis."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._states: dict[str, _State] = {}

    def _refilled(self, budget: Budget) -> tuple[_State, float, int]:
        now = self._clock()
        slot = math.floor(now / SLOT_S)
        state = self._states.setdefault(
            budget.name, _State(budget.request_capacity, budget.token_capacity, now))
        oldest = slot - math.ceil(budget.flight_timeout_s / SLOT_S)
        for stale in [n for n in state.flights if n < oldest]:
            del state.flights[stale]
        elapsed = max(0.0, now - max(state.ts, state.bu))  # no refill during a 429 block
        state.r = min(budget.request_capacity, state.r + elapsed * budget.request_rate)
        state.t = min(budget.token_capacity, state.t + elapsed * budget.token_rate)
        state.ts = now
        return state, now, slot

    @staticmethod
    def _in_flight(state: _State) -> tuple[float, float]:
        return (sum(q for q, _ in state.flights.values()),
                sum(f for _, f in state.flights.values()))

    def acquire(self, budget: Budget, costs: Sequence[int], floor: float) -> Admission:
        with self._lock:
            state, now, slot = self._refilled(budget)
            if now < max(state.bu, state.pu):
                return Admission(0, max(state.bu, state.pu) - now, slot,
                                 self._in_flight(state)[1])
            admitted, total, wait = 0, 0, 0.0
            for cost in costs:
                floor_r = min(floor * budget.request_capacity
                              + budget.margin_s * budget.request_rate,
                              budget.request_capacity - 1)
                floor_t = min(floor * budget.token_capacity + budget.margin_s * budget.token_rate,
                              budget.token_capacity - cost)
                if state.r - 1 < floor_r - EPS or state.t - cost < floor_t - EPS:
                    wait = max(0.0, (1 + floor_r - state.r) / budget.request_rate,
                               (cost + floor_t - state.t) / budget.token_rate)
                    break
                state.r -= 1
                state.t -= cost
                admitted, total = admitted + 1, total + cost
            if admitted:
                flight = state.flights.setdefault(slot, [0.0, 0.0])
                flight[0] += admitted
                flight[1] += total
            return Admission(admitted, wait, slot, self._in_flight(state)[1])

    def settle(self, budget: Budget, settlements: Sequence[Settlement]) -> None:
        with self._lock:
            state, _, _ = self._refilled(budget)
            for settlement in settlements:
                slot, cost, refund = settlement.slot, settlement.cost, settlement.refund
                if slot in state.flights:
                    flight = state.flights[slot]
                    flight[0] -= 1
                    flight[1] -= cost
                    if flight[0] <= EPS:
                        del state.flights[slot]
                _, f = self._in_flight(state)
                if refund < 0:
                    state.t += refund
                else:
                    state.t = max(state.t, min(state.t + refund, budget.token_capacity - f))

    def drain(self, budget: Budget, seconds: float) -> None:
        with self._lock:
            state, now, _ = self._refilled(budget)
            state.r, state.t = min(state.r, 0.0), min(state.t, 0.0)
            state.bu = max(state.bu, now + seconds)

    def pause(self, budget: Budget, seconds: float) -> None:
        with self._lock:
            state, now, _ = self._refilled(budget)
            state.pu = max(state.pu, now + seconds)

    def clamp(self, budget: Budget, requests: float | None, tokens: float | None) -> None:
        with self._lock:
            state, _, _ = self._refilled(budget)
            if requests is not None:
                state.r = min(state.r, requests)
            if tokens is not None:
                state.t = min(state.t, tokens)

    def levels(self, budget: Budget) -> Levels:
        with self._lock:
            state, now, _ = self._refilled(budget)
            return Levels(state.r, state.t, max(0.0, state.bu - now, state.pu - now))


def sleep_time(wait_s: float) -> float:
    """Sleep a hair past the exact wait so the next acquire lands after the refill."""
    return 0.0 if wait_s <= 0 else wait_s + 0.001 if math.isfinite(wait_s) else wait_s


def describe(deployment: Deployment, limiter: Limiter) -> dict[str, object]:
    """A deployment's limits and how full its buckets are now, for `quotaflow limits`."""
    budget = Budget.of(deployment)
    levels = limiter.levels(budget)
    return {
        "deployment": deployment.name,
        "provider": deployment.provider,
        "model": deployment.model,
        "rpm": deployment.rpm,
        "tpm": deployment.tpm,
        "burst_seconds": deployment.burst_seconds,
        "requests_available": round(levels.requests, 2),
        "tokens_available": round(levels.tokens, 1),
        "request_capacity": budget.request_capacity,
        "token_capacity": budget.token_capacity,
        "blocked_for_s": round(levels.blocked_s, 3),
        "utilisation": round(levels.utilisation(budget), 4),
    }


def make_limiter(settings_url: str | None) -> Limiter:
    """The shared Redis limiter when a Redis URL is configured, else the in-process twin."""
    return RedisLimiter(settings_url) if settings_url else LocalLimiter()

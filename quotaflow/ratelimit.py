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
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import redis

from quotaflow.config import Deployment
from quotaflow.constants import REDIS_PREFIX
from quotaflow.errors import QuotaflowError, ServiceUnavailable

SCRIPT = Path(__file__).with_name("lua") / "bucket.lua"
EPS = 1e-9


class RequestTooLarge(QuotaflowError):
    """The request costs more tokens than the deployment's bucket can ever hold."""


@dataclass(frozen=True)
class Budget:
    """One deployment's limits, as the buckets see them."""

    name: str
    rpm: float
    tpm: float
    burst_seconds: float = 60.0

    @classmethod
    def of(cls, deployment: Deployment) -> "Budget":
        return cls(deployment.name, deployment.rpm, deployment.tpm, deployment.burst_seconds)

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

    def args(self) -> list[str]:
        return [repr(self.request_rate), repr(self.request_capacity),
                repr(self.token_rate), repr(self.token_capacity)]


@dataclass(frozen=True)
class Admission:
    """How many of the requests asked for were admitted, and the wait before the next fits."""

    admitted: int
    wait_s: float


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

    def adjust(self, budget: Budget, requests: float, tokens: float) -> None: ...

    def drain(self, budget: Budget, seconds: float) -> None: ...

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
            reply = self._script(keys=[bucket_key(budget.name)], args=[op, *budget.args(), *extra])
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise ServiceUnavailable(
                f"the limiter's Redis is unreachable ({exc.__class__.__name__}); check "
                "QUOTAFLOW_REDIS_URL and that Redis is running — work waits until it is back"
            ) from exc
        return [float(value) for value in reply]

    def acquire(self, budget: Budget, costs: Sequence[int], floor: float) -> Admission:
        admitted, wait, *_ = self._call(budget, "acquire", repr(floor), *map(str, costs))
        return Admission(int(admitted), wait)

    def adjust(self, budget: Budget, requests: float, tokens: float) -> None:
        self._call(budget, "adjust", repr(float(requests)), repr(float(tokens)))

    def drain(self, budget: Budget, seconds: float) -> None:
        self._call(budget, "drain", repr(float(seconds)))

    def clamp(self, budget: Budget, requests: float | None, tokens: float | None) -> None:
        self._call(budget, "clamp", "" if requests is None else repr(float(requests)),
                   "" if tokens is None else repr(float(tokens)))

    def levels(self, budget: Budget) -> Levels:
        _, _, r, t, blocked = self._call(budget, "peek")
        return Levels(r, t, blocked)

    def close(self) -> None:
        self._redis.close()


@dataclass
class _State:
    r: float
    t: float
    ts: float
    bu: float = 0.0


class LocalLimiter:
    """The in-process twin of bucket.lua, for one process with no Redis."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._states: dict[str, _State] = {}

    def _refilled(self, budget: Budget) -> tuple[_State, float]:
        now = self._clock()
        state = self._states.setdefault(
            budget.name, _State(budget.request_capacity, budget.token_capacity, now))
        elapsed = max(0.0, now - max(state.ts, state.bu))  # no refill during a 429 block
        state.r = min(budget.request_capacity, state.r + elapsed * budget.request_rate)
        state.t = min(budget.token_capacity, state.t + elapsed * budget.token_rate)
        state.ts = now
        return state, now

    def acquire(self, budget: Budget, costs: Sequence[int], floor: float) -> Admission:
        with self._lock:
            state, now = self._refilled(budget)
            if now < state.bu:
                return Admission(0, state.bu - now)
            admitted = 0
            for cost in costs:
                floor_r = min(floor * budget.request_capacity, budget.request_capacity - 1)
                floor_t = min(floor * budget.token_capacity, budget.token_capacity - cost)
                if state.r - 1 >= floor_r - EPS and state.t - cost >= floor_t - EPS:
                    state.r -= 1
                    state.t -= cost
                    admitted += 1
                    continue
                wait = max(0.0, (1 + floor_r - state.r) / budget.request_rate,
                           (cost + floor_t - state.t) / budget.token_rate)
                return Admission(admitted, wait)
            return Admission(admitted, 0.0)

    def adjust(self, budget: Budget, requests: float, tokens: float) -> None:
        with self._lock:
            state, _ = self._refilled(budget)
            state.r = min(budget.request_capacity, state.r + requests)
            state.t = min(budget.token_capacity, state.t + tokens)

    def drain(self, budget: Budget, seconds: float) -> None:
        with self._lock:
            state, now = self._refilled(budget)
            state.r, state.t = min(state.r, 0.0), min(state.t, 0.0)
            state.bu = max(state.bu, now + seconds)

    def clamp(self, budget: Budget, requests: float | None, tokens: float | None) -> None:
        with self._lock:
            state, _ = self._refilled(budget)
            if requests is not None:
                state.r = min(state.r, requests)
            if tokens is not None:
                state.t = min(state.t, tokens)

    def levels(self, budget: Budget) -> Levels:
        with self._lock:
            state, now = self._refilled(budget)
            return Levels(state.r, state.t, max(0.0, state.bu - now))


def sleep_time(wait_s: float) -> float:
    """Sleep a hair past the exact wait so the next acquire lands after the refill."""
    return 0.0 if wait_s <= 0 else wait_s + 0.001 if math.isfinite(wait_s) else wait_s


def make_limiter(settings_url: str | None) -> Limiter:
    """The shared Redis limiter when a Redis URL is configured, else the in-process twin."""
    return RedisLimiter(settings_url) if settings_url else LocalLimiter()

"""Circuit breakers: stop sending to a deployment that keeps failing, probe it, resume.

A run of `circuit_failures` failures in a row (5xx, timeouts, resets,
malformed answers) opens a deployment's circuit: the router sends it nothing
for `circuit_cooldown_s`, then lets exactly one probe through (half-open); a
success closes the circuit, a failed probe opens it again. A 429 is never a
failure here: it means the budget is spent, which the limiter handles.

`RedisCircuitBreaker` keeps the state in Redis (quotaflow/budget/lua/circuit.lua),
so every worker sees a deployment fail as one; `LocalCircuitBreaker` is its
in-process twin for the embedded mode. Both pass tests/cluster/test_circuit.py.
"""

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Protocol

from quotaflow.constants import REDIS_PREFIX
from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import ServiceUnavailable
from quotaflow.redis_clients import UNREACHABLE, connect
from quotaflow.redis_scripts import load_script

SCRIPT = Path(__file__).with_name("lua") / "circuit.lua"
# A probe that has not answered in its deployment's timeout plus this is presumed lost.
PROBE_GRACE_S = 5.0


class CircuitState(IntEnum):
    CLOSED = 0
    OPEN = 1
    PROBE_FREE = 2  # half-open: one caller may claim the probe
    PROBING = 3  # half-open: a probe is in flight


@dataclass(frozen=True)
class Circuit:
    """A deployment's circuit now; `wait_s` is how long until that may change."""

    state: CircuitState
    wait_s: float = 0.0

    @property
    def usable(self) -> bool:
        return self.state in (CircuitState.CLOSED, CircuitState.PROBE_FREE)


CLOSED = Circuit(CircuitState.CLOSED)


class CircuitBreaker(Protocol):
    def state(self, deployment: Deployment) -> Circuit: ...

    def try_probe(self, deployment: Deployment) -> bool:
        """Claim the one probe of a half-open circuit; False if another caller has it."""

    def record_success(self, deployment: Deployment) -> None: ...

    def record_failure(self, deployment: Deployment) -> Circuit: ...


def circuit_key(name: str) -> str:
    return f"{{{REDIS_PREFIX}:cb:{name}}}"


def _probe_s(deployment: Deployment) -> float:
    return deployment.timeout_s + PROBE_GRACE_S


class RedisCircuitBreaker:
    """The cluster-wide breaker: one Lua call per operation, on the Redis server's clock.

    With `closed_for_s`, a circuit read as closed is taken as closed for that long
    without asking again: the router looks before every chunk it admits, and a
    round trip each time cost more than the call it guarded. Another worker's
    failures are then seen that much later; this process's own are seen at once.
    A success is only sent where the last read found failures to forget, so a
    healthy deployment costs no round trip per answer either.
    """

    def __init__(self, url: str, closed_for_s: float = 0.0) -> None:
        self._redis = connect(url, socket_timeout=5, socket_connect_timeout=5)
        self._script = load_script(self._redis, SCRIPT.read_text())
        self._closed_for_s = closed_for_s
        self._closed_until: dict[str, float] = {}
        self._clean: set[str] = set()  # closed, no failures counted, as last read

    def _call(self, deployment: Deployment, op: str, *extra: str) -> tuple[bool, Circuit]:
        try:
            reply = self._script(keys=[circuit_key(deployment.name)], args=[op, *extra])
        except UNREACHABLE as exc:
            raise ServiceUnavailable(
                f"the circuit breaker's Redis is unreachable ({exc.__class__.__name__}); "
                "check QUOTAFLOW_REDIS_URL and that Redis is running") from exc
        claimed, state, wait, fails = reply.split()
        circuit = Circuit(CircuitState(int(state)), float(wait))
        if self._closed_for_s and circuit.state == CircuitState.CLOSED:
            self._closed_until[deployment.name] = time.monotonic() + self._closed_for_s
            if fails == b"0":
                self._clean.add(deployment.name)
            else:
                self._clean.discard(deployment.name)
        else:
            self._forget(deployment)
        return claimed == b"1", circuit

    def _fresh(self, deployment: Deployment) -> bool:
        return self._closed_until.get(deployment.name, 0.0) > time.monotonic()

    def _forget(self, deployment: Deployment) -> None:
        self._closed_until.pop(deployment.name, None)
        self._clean.discard(deployment.name)

    def state(self, deployment: Deployment) -> Circuit:
        if self._fresh(deployment):
            return CLOSED
        return self._call(deployment, "peek")[1]

    def try_probe(self, deployment: Deployment) -> bool:
        return self._call(deployment, "probe", repr(_probe_s(deployment)))[0]

    def record_success(self, deployment: Deployment) -> None:
        if deployment.name in self._clean and self._fresh(deployment):
            return  # nothing to forget: closed with no failures, as read just now
        self._call(deployment, "success")

    def record_failure(self, deployment: Deployment) -> Circuit:
        self._forget(deployment)
        return self._call(deployment, "failure", str(deployment.circuit_failures),
                          repr(deployment.circuit_cooldown_s))[1]

    def close(self) -> None:
        self._redis.close()


@dataclass
class _Breaker:
    fails: int = 0
    opened: float | None = None
    probe_from: float = 0.0
    probe_until: float = 0.0


class LocalCircuitBreaker:
    """The in-process twin of circuit.lua, for one process with no Redis."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._breakers: dict[str, _Breaker] = {}

    def _circuit(self, breaker: _Breaker, now: float) -> Circuit:
        if breaker.opened is None:
            return Circuit(CircuitState.CLOSED)
        if now < breaker.probe_from:
            return Circuit(CircuitState.OPEN, breaker.probe_from - now)
        if now < breaker.probe_until:
            return Circuit(CircuitState.PROBING, breaker.probe_until - now)
        return Circuit(CircuitState.PROBE_FREE)

    def state(self, deployment: Deployment) -> Circuit:
        with self._lock:
            breaker = self._breakers.get(deployment.name, _Breaker())
            return self._circuit(breaker, self._clock())

    def try_probe(self, deployment: Deployment) -> bool:
        with self._lock:
            now = self._clock()
            breaker = self._breakers.setdefault(deployment.name, _Breaker())
            if self._circuit(breaker, now).state != CircuitState.PROBE_FREE:
                return False
            breaker.probe_until = now + _probe_s(deployment)
            return True

    def record_success(self, deployment: Deployment) -> None:
        with self._lock:
            self._breakers.pop(deployment.name, None)

    def record_failure(self, deployment: Deployment) -> Circuit:
        with self._lock:
            now = self._clock()
            breaker = self._breakers.setdefault(deployment.name, _Breaker())
            breaker.fails += 1
            probing = breaker.opened is not None and breaker.probe_until > 0
            if probing or (breaker.opened is None and breaker.fails >= deployment.circuit_failures):
                breaker.opened = now
                breaker.probe_from = now + deployment.circuit_cooldown_s
                breaker.probe_until = 0.0
            return self._circuit(breaker, now)


def make_breaker(url: str | None, closed_for_s: float = 0.0) -> CircuitBreaker:
    """The shared Redis breaker when a Redis URL is configured, else the in-process twin."""
    return RedisCircuitBreaker(url, closed_for_s) if url else LocalCircuitBreaker()

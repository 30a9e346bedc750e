"""The circuit breaker, one suite over the Redis breaker and its in-process twin."""

import time
from collections.abc import Callable, Iterator

import pytest

from quotaflow.budget.circuit import (
    CircuitBreaker,
    CircuitState,
    LocalCircuitBreaker,
    RedisCircuitBreaker,
)
from tests.unit.budget.test_circuit import COOLDOWN_S, deployment


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["redis", "redis-cached", "local"])
def breaker(request, redis_url: str) -> Iterator[tuple[CircuitBreaker, Callable[[float], None]]]:
    """A breaker and a way to let time pass: real time for Redis (its clock is the
    server's), a hand-moved clock for the in-process one. The cached Redis breaker is
    the workers' (closed circuits read again after 0.25 s)."""
    if request.param.startswith("redis"):
        redis_breaker = RedisCircuitBreaker(redis_url,
                                            0.25 if request.param == "redis-cached" else 0.0)
        yield redis_breaker, time.sleep
        redis_breaker.close()
    else:
        clock = Clock()

        def advance(seconds: float) -> None:
            clock.now += seconds

        yield LocalCircuitBreaker(clock), advance


def test_a_run_of_failures_opens_the_circuit(breaker) -> None:
    circuits, _ = breaker
    target = deployment(failures=3)
    # Given two failures, a success, then two more: never three in a row
    for outcome in ("fail", "fail", "ok", "fail", "fail"):
        if outcome == "ok":
            circuits.record_success(target)
        else:
            assert circuits.record_failure(target).state == CircuitState.CLOSED
    assert circuits.state(target).state == CircuitState.CLOSED
    # When the third failure in a row comes
    opened = circuits.record_failure(target)
    # Then the circuit is open for the cooldown
    assert opened.state == CircuitState.OPEN
    assert 0 < opened.wait_s <= COOLDOWN_S
    assert not circuits.try_probe(target)


def test_after_the_cooldown_one_probe_goes_and_its_success_closes(breaker) -> None:
    circuits, wait = breaker
    target = deployment(failures=1)
    circuits.record_failure(target)
    wait(COOLDOWN_S + 0.05)
    # Then the circuit is half-open and exactly one caller gets the probe
    assert circuits.state(target).state == CircuitState.PROBE_FREE
    assert circuits.try_probe(target)
    assert not circuits.try_probe(target)
    assert circuits.state(target).state == CircuitState.PROBING
    # And a successful probe closes it for everyone
    circuits.record_success(target)
    assert circuits.state(target).state == CircuitState.CLOSED


def test_a_failed_probe_opens_the_circuit_again(breaker) -> None:
    circuits, wait = breaker
    target = deployment(failures=2)
    circuits.record_failure(target)
    circuits.record_failure(target)
    wait(COOLDOWN_S + 0.05)
    assert circuits.try_probe(target)
    reopened = circuits.record_failure(target)
    assert reopened.state == CircuitState.OPEN
    assert reopened.wait_s > COOLDOWN_S / 2


def test_a_lost_probe_frees_the_probe_after_its_timeout(breaker) -> None:
    circuits, wait = breaker
    target = deployment(failures=1)
    circuits.record_failure(target)
    wait(COOLDOWN_S + 0.05)
    assert circuits.try_probe(target)
    probing = circuits.state(target)
    # The probe's worker died: after the deployment's timeout (+ grace) another may probe
    assert probing.state == CircuitState.PROBING
    assert target.timeout_s < probing.wait_s <= target.timeout_s + 5.0


def test_deployments_have_separate_circuits(breaker) -> None:
    circuits, _ = breaker
    failing, healthy = deployment(failures=1), deployment(failures=1)
    circuits.record_failure(failing)
    assert circuits.state(failing).state == CircuitState.OPEN
    assert circuits.state(healthy).state == CircuitState.CLOSED


def test_a_cached_breaker_sees_its_own_failures_at_once_and_others_soon(redis_url) -> None:
    # Given a worker's breaker that takes a closed circuit as closed for 0.3 s
    cached = RedisCircuitBreaker(redis_url, closed_for_s=0.3)
    other = RedisCircuitBreaker(redis_url)
    target, own = deployment(failures=2), deployment(failures=2)
    assert cached.state(target).state == CircuitState.CLOSED
    # When another worker's failures open the circuit
    other.record_failure(target)
    assert other.record_failure(target).state == CircuitState.OPEN
    # Then this worker routes there at most 0.3 s longer
    assert cached.state(target).state == CircuitState.CLOSED
    time.sleep(0.35)
    assert cached.state(target).state == CircuitState.OPEN
    # And its own failures count at once
    assert cached.state(own).state == CircuitState.CLOSED
    cached.record_failure(own)
    assert cached.record_failure(own).state == CircuitState.OPEN
    assert cached.state(own).state == CircuitState.OPEN


def test_a_cached_breaker_forgets_failures_it_has_read(redis_url) -> None:
    # Given a failure counted by another worker, read by this one once its cache lapsed
    cached = RedisCircuitBreaker(redis_url, closed_for_s=0.2)
    other = RedisCircuitBreaker(redis_url)
    target = deployment(failures=2)
    other.record_failure(target)
    assert cached.state(target).state == CircuitState.CLOSED
    # When this worker's call succeeds, then another fails
    cached.record_success(target)
    # Then the failures were not in a row: the circuit stays closed
    assert other.record_failure(target).state == CircuitState.CLOSED

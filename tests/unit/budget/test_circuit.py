"""The circuit breaker without a server: an unreachable Redis is a clear error, and the
deployments every breaker test uses (the suite over the Redis breaker and its in-process
twin: tests/cluster/test_circuit.py)."""

import uuid

import pytest

from quotaflow.budget.circuit import RedisCircuitBreaker
from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import ServiceUnavailable

COOLDOWN_S = 0.4


def deployment(failures: int = 3) -> Deployment:
    return Deployment(name=f"d-{uuid.uuid4().hex[:8]}", provider="mock", model="m", rpm=60,
                      tpm=1000, circuit_failures=failures, circuit_cooldown_s=COOLDOWN_S,
                      timeout_s=1)


def test_an_unreachable_redis_is_a_clear_error() -> None:
    circuits = RedisCircuitBreaker("redis://127.0.0.1:1/0")
    with pytest.raises(ServiceUnavailable, match="circuit breaker's Redis is unreachable"):
        circuits.state(deployment())

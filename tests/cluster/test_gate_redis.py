"""The gate (quotaflow/execution/gate.py) on the Redis limiter: a retry's re-admission asks
bucket.lua for one request, as a first admission does. A retry used to send its input
cost too, even where the budget is not split, which the script counts as a second
request: each retry took two requests of the deployment's RPM."""

import asyncio
import uuid
from pathlib import Path

import pytest

from quotaflow.budget.buckets import RedisLimiter
from quotaflow.errors import RetryableProviderError
from quotaflow.execution.attempts import Caller
from tests.unit.execution.runs import Parts, Scripted, deployments, items, outcomes, route


def test_a_retry_takes_one_request_of_a_budget_that_is_not_split(redis_url: str,
                                                                  tmp_path: Path) -> None:
    # Given a deployment of its own (rpm 60: a request a second), not split, on Redis, and
    # a provider that is overloaded once
    name = f"gate-{uuid.uuid4().hex[:8]}"
    limiter = RedisLimiter(redis_url)
    parts = Parts(deployments(tmp_path, name, rpm=60, safety_margin_s=0.0),
                  Scripted([RetryableProviderError("overloaded", status_code=503)]), limiter)
    budget = parts.catalog.deployments[name].budget
    run = parts.run()

    async def scenario() -> float:
        before = limiter.levels(budget).requests
        gate = parts.gate()
        choice = gate.choose(route(parts.catalog))
        assert choice.deployment is not None
        asked, _ = gate.prepare(run, choice.deployment, items(1))
        assert gate.acquire(run, asked).admitted == 1
        await Caller(gate).call(run, route(parts.catalog), asked[0])
        return before - limiter.levels(budget).requests

    try:
        # When the item is admitted, fails, and is admitted again and answered
        taken = asyncio.run(scenario())
    finally:
        limiter.close()
    # Then the two admissions took two requests from the bucket, not three
    assert outcomes(run)[0][1] is not None and outcomes(run)[0][1].attempts == 2
    assert taken == pytest.approx(2.0, abs=0.5), taken

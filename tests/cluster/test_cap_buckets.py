"""Caps inside a deployment's budget on the Redis limiter (bucket.lua): the suite of
tests/unit/budget/test_caps.py, run here against it, and the cap's hash beside the
deployment's in one Redis Cluster slot."""

from collections.abc import Iterator

import pytest
import redis

from quotaflow.budget.buckets import RedisLimiter
from quotaflow.budget.caps import cap_key
from quotaflow.deployments.limits import Cap

# The suite, collected here too: its tests take `limiter` from this module.
from tests.unit.budget.test_caps import (  # noqa: F401
    deployment,
    test_a_call_never_sent_gives_its_request_and_tokens_back_to_the_cap,
    test_a_cap_admits_its_capacity_then_the_exact_wait,
    test_a_cap_that_refuses_takes_nothing_from_the_deployment,
    test_a_split_budgets_cap_counts_input_and_output_tokens,
    test_no_refund_to_the_cap_where_the_provider_keeps_reservations_but_debts,
    test_refunds_go_back_to_the_cap_where_the_deployment_gives_back,
    test_the_deployment_binds_a_capped_tenant_too,
    test_the_tighter_of_a_tenant_and_a_job_cap_binds,
)


@pytest.fixture(params=["redis"])
def limiter(redis_url: str) -> Iterator[RedisLimiter]:
    shared = RedisLimiter(redis_url)
    yield shared
    shared.close()


def test_the_caps_hash_shares_the_deployments_slot_and_expires_once_full(
        redis_url: str) -> None:
    shared = RedisLimiter(redis_url)
    capped = deployment().with_caps((Cap("tenant:a", rpm=60),))
    try:
        assert shared.acquire(capped, [1], 0.0).admitted == 1
    finally:
        shared.close()
    key = cap_key(capped.name, "tenant:a")
    assert key.startswith("{") and key.split("}")[0] == "{quotaflow:rl:" + capped.name
    client = redis.Redis.from_url(redis_url)
    # One request of 60 a minute refills in a second: the hash lives about two
    assert 0 < client.pttl(key) <= 2_100

"""Split budgets (Anthropic's ITPM beside OTPM) in the Redis Lua limiter: the suite of
tests/unit/budget/test_split_budget.py, run here against Redis (the in-process twin runs it
there)."""

from collections.abc import Iterator

import pytest

from quotaflow.budget.buckets import RedisLimiter

# The suite, collected here too: its tests take `limiter` from this module.
from tests.unit.budget.test_split_budget import (  # noqa: F401
    test_a_drain_empties_the_input_bucket_too,
    test_a_provider_that_keeps_reservations_gives_nothing_back,
    test_all_three_must_fit_at_once,
    test_the_input_bucket_binds_with_its_exact_wait,
    test_the_input_estimate_is_corrected_both_ways_whatever_the_refund_mode,
    test_the_output_bucket_binds_with_its_exact_wait,
    test_the_providers_remaining_input_tokens_clamp_the_input_bucket,
    test_unused_max_tokens_come_back_where_the_provider_refunds,
)


@pytest.fixture(params=["redis"])
def limiter(redis_url: str) -> Iterator[RedisLimiter]:
    shared = RedisLimiter(redis_url)
    yield shared
    shared.close()

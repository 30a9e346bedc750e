"""Split budgets (Anthropic's ITPM beside OTPM): both limiters hold a third bucket.

The tokens bucket holds output tokens (max_tokens, refunded as the budget's refund
mode says) and the input bucket the prompt's estimate, corrected both ways at
settle. Same suite against the Redis Lua limiter (tests/cluster/test_split_budget.py) and
its in-process twin (here).
"""

import uuid

import pytest

from quotaflow.budget.buckets import LocalLimiter
from quotaflow.budget.limiter import Settlement
from quotaflow.deployments.limits import Budget, Refunds
from quotaflow.errors import RequestTooLarge


@pytest.fixture(params=["local"])
def limiter() -> LocalLimiter:
    """The in-process limiter; tests/cluster/test_split_budget.py runs this suite against
    the Redis one, under the id [redis]."""
    return LocalLimiter()


def split(rpm: float = 60_000, itpm: float = 600, otpm: float = 600,
          refunds: Refunds = Refunds.ALWAYS) -> Budget:
    return Budget(f"split-{uuid.uuid4().hex[:8]}", rpm, otpm, 60.0, refunds=refunds, itpm=itpm)


def test_the_input_bucket_binds_with_its_exact_wait(limiter) -> None:
    budget = split(itpm=600, otpm=60_000)
    admission = limiter.acquire(budget, [1] * 10, 0.0, [100] * 10)
    assert admission.admitted == 6
    assert 9.9 < admission.wait_s <= 10.0  # 100 input tokens at 10 a second


def test_the_output_bucket_binds_with_its_exact_wait(limiter) -> None:
    budget = split(itpm=60_000, otpm=600)
    admission = limiter.acquire(budget, [100] * 10, 0.0, [1] * 10)
    assert admission.admitted == 6
    assert 9.9 < admission.wait_s <= 10.0


def test_all_three_must_fit_at_once(limiter) -> None:
    budget = split(rpm=3, itpm=60_000, otpm=60_000)
    admission = limiter.acquire(budget, [1] * 5, 0.0, [1] * 5)
    assert admission.admitted == 3 and 19.9 < admission.wait_s <= 20.0
    levels = limiter.levels(budget)
    assert levels.inputs == pytest.approx(60_000 - 3, abs=1)
    assert levels.tokens == pytest.approx(60_000 - 3, abs=1)


def test_unused_max_tokens_come_back_where_the_provider_refunds(limiter) -> None:
    budget = split(itpm=60_000, otpm=600)
    admission = limiter.acquire(budget, [300, 300], 0.0, [10, 10])
    assert admission.admitted == 2
    limiter.settle(budget, [Settlement(admission.slot, 300, 250.0, 10, 0.0)])
    assert limiter.acquire(budget, [250], 0.0, [10]).admitted == 1


def test_a_provider_that_keeps_reservations_gives_nothing_back(limiter) -> None:
    budget = split(itpm=60_000, otpm=600, refunds=Refunds.NEVER)
    admission = limiter.acquire(budget, [300, 300], 0.0, [10, 10])
    limiter.settle(budget, [Settlement(admission.slot, 300, 250.0, 10, 0.0)])
    assert limiter.acquire(budget, [250], 0.0, [10]).admitted == 0


def test_the_input_estimate_is_corrected_both_ways_whatever_the_refund_mode(limiter) -> None:
    budget = split(itpm=600, otpm=60_000, refunds=Refunds.NEVER)
    admission = limiter.acquire(budget, [1, 1], 0.0, [300, 300])
    assert admission.admitted == 2
    # The provider counted 100 of the first prompt's 300 estimated tokens: 200 back.
    limiter.settle(budget, [Settlement(admission.slot, 1, 0.0, 300, 200.0)])
    assert limiter.acquire(budget, [1], 0.0, [200]).admitted == 1
    # And 100 more than estimated of the second: a debt.
    limiter.settle(budget, [Settlement(admission.slot, 1, 0.0, 300, -100.0)])
    assert limiter.levels(budget).inputs == pytest.approx(-100, abs=2)


def test_the_providers_remaining_input_tokens_clamp_the_input_bucket(limiter) -> None:
    budget = split(itpm=600, otpm=600)
    limiter.clamp(budget, None, None, inputs=50.0)
    assert limiter.acquire(budget, [1], 0.0, [100]).admitted == 0
    assert limiter.levels(budget).tokens == pytest.approx(600, abs=1)


def test_a_drain_empties_the_input_bucket_too(limiter) -> None:
    budget = split()
    limiter.drain(budget, 0.5)
    assert limiter.levels(budget).inputs <= 0


def test_a_request_larger_than_a_bucket_is_refused_naming_the_limit() -> None:
    budget = split(itpm=600, otpm=6_000)
    with pytest.raises(RequestTooLarge, match=r"input tokens.*itpm 600"):
        budget.check_fits(10, 700)
    with pytest.raises(RequestTooLarge, match=r"output tokens.*otpm 6000"):
        budget.check_fits(7_000, 10)
    budget.check_fits(6_000, 600)

"""Caps inside a deployment's budget (a tenant's, a job's RPM/TPM): one suite, two
limiters. Here against the in-process one; tests/cluster/test_cap_buckets.py runs it
against the Redis one (bucket.lua), which must agree.

Times are real, so budgets are sized to make waits long and exact.
"""

import uuid

import pytest

from quotaflow.budget.buckets import LocalLimiter
from quotaflow.budget.caps import caps_of, check_cap
from quotaflow.budget.limiter import Limiter, Settlement
from quotaflow.deployments.limits import Budget, Cap, Refunds
from quotaflow.errors import InvalidParameter, RequestTooLarge


@pytest.fixture(params=["local"])
def limiter() -> LocalLimiter:
    return LocalLimiter()


def deployment(rpm: float = 6_000, tpm: float = 60_000, refunds: Refunds = Refunds.ALWAYS,
               itpm: float = 0.0) -> Budget:
    """A roomy deployment budget (per minute: burst 60 s), its name unique per test."""
    return Budget(f"cap-{uuid.uuid4().hex[:8]}", rpm, tpm, 60.0, refunds=refunds, itpm=itpm)


def test_a_cap_admits_its_capacity_then_the_exact_wait(limiter: Limiter) -> None:
    # Given a tenant capped at 600 tokens a minute inside a 60,000 TPM deployment
    capped = deployment().with_caps((Cap("tenant:a", tpm=600),))
    # When it asks for ten 100-token requests
    admission = limiter.acquire(capped, [100] * 10, 0.0)
    # Then six fit its cap, and the seventh in 100 / 10 = 10 s, the cap's wait
    assert admission.admitted == 6 and admission.capped
    assert 9.9 < admission.wait_s <= 10.0


def test_a_cap_that_refuses_takes_nothing_from_the_deployment(limiter: Limiter) -> None:
    shared = deployment(rpm=60, tpm=60_000)
    capped = shared.with_caps((Cap("tenant:a", rpm=2),))
    assert limiter.acquire(capped, [10] * 5, 0.0).admitted == 2
    refused = limiter.acquire(capped, [10] * 3, 0.0)
    assert refused.admitted == 0 and refused.capped and 29.0 < refused.wait_s <= 30.0
    # The deployment lost only the two admitted requests: the other tenant has the rest
    assert limiter.levels(shared).requests == pytest.approx(58, abs=0.1)
    other = limiter.acquire(shared, [10] * 58, 0.0)
    assert other.admitted == 58 and not other.capped


def test_the_deployment_binds_a_capped_tenant_too(limiter: Limiter) -> None:
    shared = deployment(rpm=3)
    capped = shared.with_caps((Cap("tenant:a", rpm=100),))
    admission = limiter.acquire(capped, [1] * 5, 0.0)
    assert admission.admitted == 3 and not admission.capped
    assert 19.9 < admission.wait_s <= 20.0


def test_the_tighter_of_a_tenant_and_a_job_cap_binds(limiter: Limiter) -> None:
    shared = deployment()
    both = shared.with_caps(caps_of("a", 10, None, "job1", 3, None))
    assert limiter.acquire(both, [1] * 5, 0.0).admitted == 3
    # Another job of the tenant has the tenant's seven left
    sibling = shared.with_caps(caps_of("a", 10, None, "job2", None, None))
    assert limiter.acquire(sibling, [1] * 10, 0.0).admitted == 7


def test_refunds_go_back_to_the_cap_where_the_deployment_gives_back(
        limiter: Limiter) -> None:
    capped = deployment(refunds=Refunds.ALWAYS).with_caps((Cap("tenant:a", tpm=600),))
    admission = limiter.acquire(capped, [300, 300], 0.0)
    assert admission.admitted == 2
    limiter.settle(capped, [Settlement(admission.slot, 300, 250.0)])
    assert limiter.levels(capped).caps[0][1] == pytest.approx(250, abs=1)
    assert limiter.acquire(capped, [240], 0.0).admitted == 1


def test_no_refund_to_the_cap_where_the_provider_keeps_reservations_but_debts(
        limiter: Limiter) -> None:
    capped = deployment(refunds=Refunds.NEVER).with_caps((Cap("tenant:a", tpm=600),))
    admission = limiter.acquire(capped, [300, 300], 0.0)
    limiter.settle(capped, [Settlement(admission.slot, 300, 250.0),
                            Settlement(admission.slot, 300, -100.0)])
    # Nothing given back; the debt of 100 counted: about -100 left
    assert limiter.levels(capped).caps[0][1] == pytest.approx(-100, abs=2)
    refused = limiter.acquire(capped, [10], 0.0)
    assert refused.admitted == 0 and refused.capped


def test_a_call_never_sent_gives_its_request_and_tokens_back_to_the_cap(
        limiter: Limiter) -> None:
    capped = deployment(refunds=Refunds.NEVER).with_caps((Cap("job:j", rpm=1, tpm=600),))
    admission = limiter.acquire(capped, [500], 0.0)
    assert admission.admitted == 1
    assert limiter.acquire(capped, [10], 0.0).admitted == 0
    limiter.settle(capped, [Settlement(admission.slot, 500, 500.0, answered=False,
                                       sent=False)])
    assert limiter.acquire(capped, [500], 0.0).admitted == 1


def test_a_split_budgets_cap_counts_input_and_output_tokens(limiter: Limiter) -> None:
    capped = deployment(tpm=60_000, itpm=60_000).with_caps((Cap("tenant:a", tpm=1_000),))
    admission = limiter.acquire(capped, [300, 300, 300], 0.0, [200, 200, 200])
    assert admission.admitted == 2 and admission.capped  # 2 x 500 fill the cap's 1,000
    limiter.settle(capped, [Settlement(admission.slot, 300, 200.0, 200, 150.0)])
    assert limiter.levels(capped).caps[0][1] == pytest.approx(350, abs=2)


def test_a_request_larger_than_the_cap_is_refused_before_it_waits_forever() -> None:
    capped = deployment().with_caps((Cap("tenant:acme", tpm=60),))
    with pytest.raises(RequestTooLarge, match="tenant acme's cap admits at most 60"):
        capped.check_fits(100)


def test_caps_are_only_what_is_set() -> None:
    assert caps_of("a", None, None, "j", None, None) == ()
    assert caps_of("a", 5, None, "j", None, 70) == (Cap("tenant:a", 5.0, 0.0),
                                                     Cap("job:j", 0.0, 70.0))
    plain = deployment()
    assert plain.with_caps(()) is plain and " ; " not in plain.packed


@pytest.mark.parametrize("bad", [0, -5, 10**13, 1.5, True, "60"])
def test_a_cap_must_be_a_whole_number_of_at_least_one(bad: object) -> None:
    with pytest.raises(InvalidParameter, match="max_rpm must be a whole number from 1"):
        check_cap("max_rpm", bad)  # type: ignore[arg-type]


def test_a_cap_of_few_requests_per_second_still_holds_one_request() -> None:
    # 30 RPM at a 1 s burst is half a request: the bucket holds one, refilling at 0.5/s
    assert Cap("job:j", rpm=30).capacities(1.0) == (1.0, 0.0)
    assert Cap("job:j", tpm=600).capacities(60.0) == (0.0, 600.0)

"""One suite, two limiters: the Redis Lua limiter and its in-process twin must agree. Here
it runs against the in-process one; tests/cluster/test_ratelimit.py runs it against Redis.

Times are real (Redis uses its own clock), so budgets are sized to make
the expected waits either long and exact or short and cheap to sleep.
"""

import threading
import time
import uuid

import pytest

from quotaflow.budget.buckets import LocalLimiter
from quotaflow.budget.limiter import Settlement, sleep_time
from quotaflow.deployments.limits import Budget, Refunds
from quotaflow.errors import RequestTooLarge


@pytest.fixture(params=["local"])
def limiter() -> LocalLimiter:
    """The in-process limiter; tests/cluster/test_ratelimit.py runs this suite against the
    Redis one, under the id [redis]."""
    return LocalLimiter()


def budget(rpm: float = 60_000, tpm: float = 6_000, burst: float = 1.0,
           margin: float = 0.0, refunds: Refunds = Refunds.ALWAYS) -> Budget:
    return Budget(f"test-{uuid.uuid4().hex[:8]}", rpm, tpm, burst, margin_s=margin,
                  refunds=refunds)


def test_acquire_is_all_or_nothing_and_returns_the_exact_wait(limiter) -> None:
    # Given 600 tokens of capacity refilling 10 a second, and requests to spare
    tokens = budget(rpm=600, tpm=600, burst=60)
    # When ten 100-token requests are asked for at once
    admission = limiter.acquire(tokens, [100] * 10, 0.0)
    # Then six fit, and the seventh fits in exactly 100 / 10 = 10 s
    assert admission.admitted == 6
    assert 9.9 < admission.wait_s <= 10.0


def test_the_requests_bucket_binds_too(limiter) -> None:
    requests = budget(rpm=3, tpm=1_000_000, burst=60)
    admission = limiter.acquire(requests, [1] * 5, 0.0)
    assert admission.admitted == 3
    assert 19.9 < admission.wait_s <= 20.0


def test_a_request_fits_once_its_wait_has_passed(limiter) -> None:
    fast = budget(tpm=6_000)  # 100 tokens, refilling 100 a second
    assert limiter.acquire(fast, [100], 0.0).admitted == 1
    denied = limiter.acquire(fast, [50], 0.0)
    assert denied.admitted == 0 and 0.45 < denied.wait_s <= 0.5
    time.sleep(sleep_time(denied.wait_s))
    assert limiter.acquire(fast, [50], 0.0).admitted == 1


def test_floors_keep_headroom_for_higher_priorities(limiter) -> None:
    fast = budget(rpm=60_000, tpm=6_000, burst=60)  # 6,000 tokens
    # Bulk (floor 20%) stops above 1,200 tokens left: 48 x 99 leaves 1,248
    assert limiter.acquire(fast, [99] * 60, 0.20).admitted == 48
    # Standard (floor 5%) may go down to 300: 9 more leave 357
    assert limiter.acquire(fast, [99] * 20, 0.05).admitted == 9
    # Realtime (floor 0) takes the rest at once
    realtime = limiter.acquire(fast, [99] * 3, 0.0)
    assert realtime.admitted == 3 and realtime.wait_s == 0


def test_a_large_request_still_fits_a_full_bucket_under_a_floor(limiter) -> None:
    fast = budget(tpm=6_000)
    assert limiter.acquire(fast, [90], 0.20).admitted == 1


def test_a_request_larger_than_the_bucket_fails_at_once() -> None:
    with pytest.raises(RequestTooLarge, match=r"needs 101 tokens .* at most 100 at once"):
        budget(tpm=6_000).check_fits(101)


def test_realtime_is_admitted_while_bulk_saturates_and_bulk_gets_the_refill_rate(limiter) -> None:
    # Given bulk work saturating a 100 token/s deployment from one thread
    fast = budget(tpm=6_000, burst=1.0)
    bulk_tokens = []
    stop = threading.Event()

    def saturate() -> None:
        while not stop.is_set():
            admission = limiter.acquire(fast, [10], 0.20)
            if admission.admitted:
                bulk_tokens.append((time.monotonic(), 10))
            else:
                time.sleep(sleep_time(admission.wait_s))

    worker = threading.Thread(target=saturate)
    worker.start()
    try:
        time.sleep(0.5)
        # When a realtime request arrives, it is admitted without waiting
        assert limiter.acquire(fast, [10], 0.0).admitted == 1
        time.sleep(2.0)
    finally:
        stop.set()
        worker.join()
    # Then bulk alone still got the whole refill rate (100 tokens/s) after its first burst
    steady = [(at, n) for at, n in bulk_tokens if at > bulk_tokens[0][0] + 0.5]
    rate = sum(n for _, n in steady) / (steady[-1][0] - steady[0][0])
    assert 85 <= rate <= 110, rate


def test_settle_refunds_below_capacity_minus_calls_in_flight_and_records_debt(limiter) -> None:
    tokens = budget(rpm=600, tpm=600, burst=60)  # 600 tokens, 10 a second
    first = limiter.acquire(tokens, [300], 0.0)
    second = limiter.acquire(tokens, [200], 0.0)
    limiter.settle(tokens, [Settlement(first.slot, 300, 250)])  # the call used 50 of its 300
    assert 349 < limiter.levels(tokens).tokens <= 351
    third = limiter.acquire(tokens, [50], 0.0)
    # 200 are still in flight: up to 600 - 200
    limiter.settle(tokens, [Settlement(third.slot, 50, 500)])
    assert limiter.levels(tokens).tokens == pytest.approx(600 - 200, abs=1)
    # nothing in flight: up to capacity
    limiter.settle(tokens, [Settlement(second.slot, 200, 500)])
    assert limiter.levels(tokens).tokens == pytest.approx(600)
    debtor = limiter.acquire(tokens, [100], 0.0)
    limiter.settle(tokens, [Settlement(debtor.slot, 100, -800)])  # a debt: it used 900, not 100
    level = limiter.levels(tokens).tokens
    assert -301 < level < -299
    assert 59.9 < limiter.acquire(tokens, [300], 0.0).wait_s <= 60.1


def test_a_chunk_of_settlements_counts_as_each_one_in_turn(limiter) -> None:
    # Workers settle a chunk of finished calls in one call: the same arithmetic, in order
    tokens = budget(rpm=600, tpm=600, burst=60)
    first = limiter.acquire(tokens, [300], 0.0)
    second = limiter.acquire(tokens, [200], 0.0)
    third = limiter.acquire(tokens, [50], 0.0)
    limiter.settle(tokens, [Settlement(first.slot, 300, 250), Settlement(third.slot, 50, 500)])
    # 250 back, then the second's 200 still in flight caps the bucket at 600 - 200
    assert limiter.levels(tokens).tokens == pytest.approx(600 - 200, abs=1)
    limiter.settle(tokens, [Settlement(second.slot, 200, 500)])
    assert limiter.levels(tokens).tokens == pytest.approx(600)


def test_a_provider_that_keeps_reservations_gets_no_refund_but_its_debts(limiter) -> None:
    tokens = budget(rpm=600, tpm=600, burst=60, refunds=Refunds.NEVER)
    first = limiter.acquire(tokens, [300], 0.0)
    limiter.settle(tokens, [Settlement(first.slot, 300, 250)])
    levels = limiter.levels(tokens)
    assert 299 < levels.tokens <= 301 and not levels.refunding
    second = limiter.acquire(tokens, [100], 0.0)
    limiter.settle(tokens, [Settlement(second.slot, 100, -300)])  # it used 400, not 100
    assert -101 < limiter.levels(tokens).tokens <= -99


@pytest.mark.parametrize("refunds", [Refunds.ALWAYS, Refunds.NEVER, Refunds.LEARNED],
                         ids=lambda refunds: refunds.name.lower())
def test_a_call_never_sent_gives_back_its_request_and_all_its_tokens(limiter, refunds) -> None:
    # A failed call may have been counted: nothing back. One never sent (its admission
    # went stale in a stalled process) cannot have been: all of it, in every mode,
    # or the budget idles while the provider refills what it never took.
    tokens = budget(rpm=60, tpm=600, burst=60, refunds=refunds)  # 60 requests, 600 tokens
    failed = limiter.acquire(tokens, [300], 0.0)
    limiter.settle(tokens, [Settlement(failed.slot, 300, 0.0, answered=False)])
    assert 299 < limiter.levels(tokens).tokens <= 301
    stale = limiter.acquire(tokens, [200], 0.0)
    limiter.settle(tokens, [Settlement(stale.slot, 200, 200.0, answered=False, sent=False)])
    levels = limiter.levels(tokens)
    assert 299 < levels.tokens <= 301
    assert 58.9 < levels.requests <= 59.1  # the failed call's request spent, the stale one's not


def test_refunds_are_learned_from_the_providers_remaining_tokens(limiter) -> None:
    # 600 tokens, 10 a second. A provider that keeps reservations can show at most what
    # is left of 600 after every admission, plus what it may not have counted yet: the
    # tokens in flight at the call's admission and those admitted after it.
    tokens = budget(rpm=600, tpm=600, burst=60, refunds=Refunds.LEARNED)
    first = limiter.acquire(tokens, [300], 0.0)
    assert not first.refunding and first.mark == 0
    # The first call's answer says 550 left: no more than 300 + its own 300 in flight
    # could leave (the provider may not have counted it yet): proves nothing
    limiter.clamp(tokens, None, 550, first.dating(300))
    assert not limiter.levels(tokens).refunding
    limiter.settle(tokens, [Settlement(first.slot, 300, 250)])  # 250 back, if given back
    second = limiter.acquire(tokens, [200], 0.0)
    assert second.mark == 300 and limiter.levels(tokens).tokens == pytest.approx(100, abs=1)
    # The second's says 350 left: more than 100 + the 200 in flight at its admission could
    # leave, however late anything was counted: refunds, proved once
    limiter.clamp(tokens, None, 350, second.dating(200))
    levels = limiter.levels(tokens)
    assert levels.refunding and levels.tokens == pytest.approx(350, abs=1)
    third = limiter.acquire(tokens, [10], 0.0)
    assert third.refunding and third.mark == 500  # spent from 350
    # Its answer says 30: below the 340 it would show had the refund come back, less the
    # refill of its age and the refunds given since (none): refunds stop at once
    limiter.clamp(tokens, None, 30, third.dating(10))
    levels = limiter.levels(tokens)
    assert not levels.refunding and levels.tokens == pytest.approx(30, abs=1)
    # and after a contradiction, switching back takes one proof more (at most 80 left
    # + 220 in flight: 500 proves it)
    fourth = limiter.acquire(tokens, [10], 0.0)
    limiter.clamp(tokens, None, 500, fourth.dating(10))
    assert not limiter.levels(tokens).refunding
    limiter.clamp(tokens, None, 500, fourth.dating(10))
    assert limiter.levels(tokens).refunding


def test_headers_that_may_predate_admissions_or_refill_learn_nothing(limiter) -> None:
    tokens = budget(rpm=600, tpm=600, burst=60, refunds=Refunds.LEARNED)
    first = limiter.acquire(tokens, [300], 0.0)
    second = limiter.acquire(tokens, [200], 0.0)
    limiter.settle(tokens, [Settlement(first.slot, 300, 250)])
    for _ in range(3):
        # at most 100 left + 300 in flight at the first's admission + 200 admitted after
        limiter.clamp(tokens, None, 600, first.dating(300))
        limiter.clamp(tokens, None, 600, second.dating(200))  # + 500 in flight
        limiter.clamp(tokens, None, 590)  # undated: a 429's headers
    levels = limiter.levels(tokens)
    assert not levels.refunding and levels.tokens == pytest.approx(100, abs=1)


def test_admission_keeps_the_safety_margin_in_hand(limiter) -> None:
    fast = budget(tpm=6_000, margin=0.05)  # 100 tokens, 100 a second: 5 tokens of margin
    assert limiter.acquire(fast, [95], 0.0).admitted == 1
    denied = limiter.acquire(fast, [10], 0.0)
    assert denied.admitted == 0 and 0.09 < denied.wait_s <= 0.1


def test_an_admission_of_a_dead_worker_is_forgotten_after_the_flight_timeout() -> None:
    now = [1000.0]
    local = LocalLimiter(clock=lambda: now[0])
    spec = Budget("leak", 600, 600, 60, flight_timeout_s=100, refunds=Refunds.ALWAYS)
    local.acquire(spec, [500], 0.0)  # its worker dies: never settled
    now[0] += 60  # the bucket refills; the lost call still counts as in flight
    other = local.acquire(spec, [100], 0.0)
    local.settle(spec, [Settlement(other.slot, 100, 100)])
    assert local.levels(spec).tokens == pytest.approx(500)  # refunds held under 600 - 500
    now[0] += 120  # past the flight timeout: the dead admission is forgotten
    again = local.acquire(spec, [100], 0.0)
    local.settle(spec, [Settlement(again.slot, 100, 100)])
    assert local.levels(spec).tokens == pytest.approx(600)


def test_drain_stops_everyone_until_retry_after(limiter) -> None:
    fast = budget(tpm=6_000)
    limiter.drain(fast, 0.5)
    blocked = limiter.acquire(fast, [1], 0.0)
    assert blocked.admitted == 0 and 0.4 < blocked.wait_s <= 0.5
    assert limiter.levels(fast).tokens <= 0.1
    time.sleep(blocked.wait_s + 0.05)
    after = limiter.acquire(fast, [50], 0.0)
    assert after.admitted == 0 and 0.3 < after.wait_s < 0.5  # it refills from empty


def test_clamp_lowers_to_what_the_provider_reports_never_raises(limiter) -> None:
    tokens = budget(rpm=600, tpm=600, burst=60, refunds=Refunds.NEVER)
    limiter.clamp(tokens, None, 30)
    assert limiter.levels(tokens).tokens == pytest.approx(30, abs=0.5)
    limiter.clamp(tokens, 5, 10_000)
    levels = limiter.levels(tokens)
    assert levels.tokens == pytest.approx(30, abs=0.5)
    assert levels.requests == pytest.approx(5, abs=0.1)
    assert levels.utilisation(tokens) == pytest.approx(1 - 5 / 600, abs=0.01)

"""The Redis Lua limiter: the suite of tests/unit/budget/test_ratelimit.py, run here against it
(its in-process twin must agree, and runs it there), and what only a shared Redis shows:
one budget across processes, the bucket's key, and Redis going away and coming back.

Times are real (Redis uses its own clock), so budgets are sized to make the expected waits
either long and exact or short and cheap to sleep.
"""

import multiprocessing
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from quotaflow.budget.buckets import RedisLimiter, bucket_key
from quotaflow.budget.limiter import Settlement, sleep_time
from quotaflow.deployments.limits import Budget
from quotaflow.errors import ServiceUnavailable
from tests.harness.servers import REDIS_URL

# The suite, collected here too: its tests take `limiter` from this module.
from tests.unit.budget.test_ratelimit import (  # noqa: F401
    budget,
    test_a_call_never_sent_gives_back_its_request_and_all_its_tokens,
    test_a_chunk_of_settlements_counts_as_each_one_in_turn,
    test_a_large_request_still_fits_a_full_bucket_under_a_floor,
    test_a_provider_that_keeps_reservations_gets_no_refund_but_its_debts,
    test_a_request_fits_once_its_wait_has_passed,
    test_acquire_is_all_or_nothing_and_returns_the_exact_wait,
    test_admission_keeps_the_safety_margin_in_hand,
    test_clamp_lowers_to_what_the_provider_reports_never_raises,
    test_drain_stops_everyone_until_retry_after,
    test_floors_keep_headroom_for_higher_priorities,
    test_headers_that_may_predate_admissions_or_refill_learn_nothing,
    test_realtime_is_admitted_while_bulk_saturates_and_bulk_gets_the_refill_rate,
    test_refunds_are_learned_from_the_providers_remaining_tokens,
    test_settle_refunds_below_capacity_minus_calls_in_flight_and_records_debt,
    test_the_requests_bucket_binds_too,
)


@pytest.fixture(params=["redis"])
def limiter(redis_url: str) -> Iterator[RedisLimiter]:
    shared = RedisLimiter(redis_url)
    yield shared
    shared.close()


def _hammer(url: str, name: str, seconds: float, out: multiprocessing.Queue) -> None:
    shared = RedisLimiter(url)
    spec = Budget(name, 60_000, 6_000, 1.0)
    admitted = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        admission = shared.acquire(spec, [10], 0.0)
        admitted += admission.admitted
        if not admission.admitted:
            time.sleep(min(sleep_time(admission.wait_s), max(0.0, deadline - time.monotonic())))
    out.put(admitted)


def test_one_budget_across_processes_is_never_exceeded(redis_url: str) -> None:
    # Given four processes hammering one 100 token/s deployment for 1.5 s
    name, seconds = f"shared-{uuid.uuid4().hex[:8]}", 1.5
    out: multiprocessing.Queue = multiprocessing.get_context("spawn").Queue()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_hammer, args=(redis_url, name, seconds, out)) for _ in range(4)]
    for proc in procs:
        proc.start()
    totals = [out.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(10)
    # Then together they got no more than the burst plus the refill, and nearly all of it
    admitted_tokens = sum(totals) * 10
    ceiling = 100 + 100 * (seconds + 1.0)  # slack for process start-up skew
    assert admitted_tokens <= ceiling
    assert admitted_tokens >= 100 + 100 * seconds * 0.8


def test_bucket_key_is_hash_tagged_and_expires_when_full(redis_url: str) -> None:
    shared = RedisLimiter(redis_url)
    spec = Budget(f"ttl-{uuid.uuid4().hex[:8]}", 60_000, 6_000, 1.0, flight_timeout_s=30)
    admission = shared.acquire(spec, [10], 0.0)
    client = redis.Redis.from_url(REDIS_URL)
    key = bucket_key(spec.name)
    assert key.startswith("{") and key.endswith("}")
    assert 30_000 < client.pttl(key) <= 42_000  # kept while a call is in flight
    shared.settle(spec, [Settlement(admission.slot, 10, 0)])
    # Full again in 0.1 s, but never shortened: a caller was told it lives that long
    assert 30_000 < client.pttl(key) <= 42_000
    idle = Budget(f"idle-{uuid.uuid4().hex[:8]}", 60_000, 6_000, 1.0)
    shared.levels(idle)  # a peek writes nothing
    assert client.pttl(bucket_key(idle.name)) == -2
    shared.clamp(idle, None, 5_990.0)  # full again in 0.1 s, plus a second of grace
    assert 0 < client.pttl(bucket_key(idle.name)) <= 2_000
    shared.close()


def test_redis_down_is_a_clear_error_and_the_limiter_resumes(throwaway_redis) -> None:
    url, start, stop = throwaway_redis
    shared = RedisLimiter(url)
    spec = budget()
    assert shared.acquire(spec, [10], 0.0).admitted == 1
    stop()
    with pytest.raises(ServiceUnavailable, match=r"Redis is unreachable.*QUOTAFLOW_REDIS_URL"):
        shared.acquire(spec, [10], 0.0)
    start()
    # Redis came back empty: the budget this worker was spending from is recreated empty
    # (the provider's may be spent), not full, and refills from there (100 tokens a second)
    first = shared.acquire(spec, [10], 0.0)  # the script is loaded again
    assert first.admitted == 0 and 0.05 < first.wait_s <= 0.11
    time.sleep(sleep_time(first.wait_s))
    assert shared.acquire(spec, [10], 0.0).admitted == 1
    shared.close()


@pytest.mark.parametrize("op", ["acquire", "clamp", "settle"])
def test_a_budget_lost_while_in_use_starts_empty_but_a_new_one_starts_full(
        redis_url: str, op: str) -> None:
    spec = Budget(f"lost-{uuid.uuid4().hex[:8]}", 60_000, 6_000, 60.0)  # 6,000 tokens
    worker, newcomer = RedisLimiter(redis_url), RedisLimiter(redis_url)
    admission = worker.acquire(spec, [1_000], 0.0)
    assert admission.admitted == 1
    # Its hash is lost while a call is in flight (evicted, flushed, a failover)
    with redis.Redis.from_url(redis_url) as client:
        client.delete(bucket_key(spec.name))
    # The worker that knew it notices, whatever it does next: empty, refilling 100 a second
    if op == "clamp":
        worker.clamp(spec, None, 5_500.0)
    elif op == "settle":
        worker.settle(spec, [Settlement(admission.slot, 1_000, 900.0)])
    else:
        assert worker.acquire(spec, [1_000], 0.0).admitted == 0
    assert worker.levels(spec).tokens < 100
    assert newcomer.acquire(spec, [1_000], 0.0).admitted == 0
    # A budget nobody has used (or whose hash expired because it was full) starts full
    fresh = Budget(f"fresh-{uuid.uuid4().hex[:8]}", 60_000, 6_000, 60.0)
    assert newcomer.acquire(fresh, [1_000] * 6, 0.0).admitted == 6
    worker.close()
    newcomer.close()


def test_a_budget_that_expired_after_its_last_call_settled_elsewhere_starts_full(
        redis_url: str) -> None:
    """One process admits a call (its hash then lives for the flight timeout), another
    settles it, leaving the bucket full: the hash must outlive what the first was told,
    or the first process's next acquire finds it gone early, reads that as lost data and
    starts the budget empty (a whole job waiting for the refill of its floor)."""
    # Refilling 100,000 tokens a second: full again a few milliseconds after a call.
    spec = Budget(f"settled-{uuid.uuid4().hex[:8]}", 60_000, 6_000_000, 60.0)
    admitter, settler = RedisLimiter(redis_url), RedisLimiter(redis_url)
    admission = admitter.acquire(spec, [1_000], 0.0)
    assert admission.admitted == 1
    settler.settle(spec, [Settlement(admission.slot, 1_000, 0.0)])
    time.sleep(1.3)  # longer than a full bucket's hash is kept (its life + 1 s)
    assert admitter.acquire(spec, [1_000] * 6, 0.0).admitted == 6
    admitter.close()
    settler.close()

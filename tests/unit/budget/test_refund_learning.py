"""Learning whether the provider gives back unused reservations (reconcile_usage = "auto")
from headers in the order and at the times a busy host delivers them: late flushes,
reordered sends, starved processes. Noise must never prove refunds; real refunds must
be learned as soon as they matter, and the first contradiction ends them.

The cause of issue 28's 429 burst is replayed first: a worker that reads an answer and
then reports it late clamps the bucket to a header older than the age it measured, so
the bucket sits below the provider by the refill of that delay, and the next fresh
headers (above it by more than their own age's refill) voted for refunds; two votes
spent refunds that a provider which keeps reservations never gave.
"""

import pytest

from quotaflow.budget.buckets import LocalLimiter
from quotaflow.budget.limiter import Settlement
from quotaflow.deployments.limits import Budget, Refunds
from tests.unit.budget.refund_sim import Clock, Jitter, simulate

CALM = Jitter()
# 5% of calls refused 429 at random before the provider counts them (an overloaded one).
FAULTY = Jitter(faults=0.05)
# A busy host: one chunk's sends or one flush in ten waits up to 0.6 s more.
BUSY = Jitter(flush_s=(0.0, 0.05), stall_p=0.1, stall_s=0.6)
# Worse: every send and answer 0-500 ms late (reordered), one in five stalls up to 1 s.
WILD = Jitter(send_s=(0.0, 0.5), back_s=(0.0, 0.5), flush_s=(0.0, 0.05), stall_p=0.2,
              stall_s=1.0)


def test_a_late_flush_followed_by_fresh_headers_proves_nothing() -> None:
    # 600 tokens, 10 a second; the provider keeps reservations. Recorded: (time, event).
    clock = Clock()
    limiter = LocalLimiter(clock)
    tokens = Budget("late-flush", 600, 600, 60.0, refunds=Refunds.LEARNED)
    clock.now = 0.0
    first = limiter.acquire(tokens, [100], 0.0)  # counted at 0.01: the provider says 500
    # The answer comes at 0.2; its worker is starved and reports it at 3.0, when the
    # provider holds 530: the bucket is clamped 30 below it.
    clock.now = 3.0
    limiter.settle(tokens, [Settlement(first.slot, 100, 0.0)])
    limiter.clamp(tokens, None, 500.0, first.dating(100))
    for n in range(3):
        clock.now = 3.1 + n
        call = limiter.acquire(tokens, [100], 0.0)
        # counted at once; answered 0.2 s later and reported in time: what the provider
        # holds is 530 + 10 a second, less this call and the ones before it
        clock.now += 0.21
        shown = 530 + 10 * (3.1 + n - 3.0) + 10 * n - 100 * (n + 1)
        limiter.settle(tokens, [Settlement(call.slot, 100, 0.0)])
        limiter.clamp(tokens, None, shown, call.dating(100))
        assert not limiter.levels(tokens).refunding, f"header {n}: {shown}"


@pytest.mark.parametrize("tpm", [60_000, 600_000])
@pytest.mark.parametrize("jitter", [CALM, BUSY, WILD, FAULTY],
                         ids=["calm", "busy", "wild", "faulty"])
@pytest.mark.parametrize("seed", range(3))
def test_a_provider_that_keeps_reservations_is_never_taken_for_one_that_gives_back(
        jitter: Jitter, tpm: int, seed: int) -> None:
    replay = simulate(provider_refunds=False, jitter=jitter, tpm=tpm, seed=seed)
    assert len(replay.headers) > 150
    assert not any(replay.refunding)
    assert replay.rejected == 0


@pytest.mark.parametrize("jitter", [CALM, BUSY, WILD], ids=["calm", "busy", "wild"])
@pytest.mark.parametrize("seed", range(3))
def test_refunds_are_learned_within_seconds_where_they_matter(jitter: Jitter, seed: int) -> None:
    # 60,000 TPM: keeping 108 tokens a request, the bucket binds within a second or two
    replay = simulate(provider_refunds=True, jitter=jitter, tpm=60_000, seed=seed)
    learned = [when for (when, *_), spending in zip(replay.headers, replay.refunding,
                                                    strict=True) if spending]
    assert learned and learned[0] < 3.0
    assert all(replay.refunding[replay.refunding.index(True):])  # and never unlearned
    assert replay.rejected == 0
    # spending refunds, the job gets far more than keeping would allow (737 requests)
    assert replay.admitted > 1_500


def test_the_first_contradiction_ends_refunds() -> None:
    # Learned from a provider that gave back; then another user of the key spends, and
    # the next header is below what the bucket could hold with every refund given back
    clock = Clock()
    limiter = LocalLimiter(clock)
    tokens = Budget("contradicted", 600, 600, 60.0, refunds=Refunds.LEARNED)
    first = limiter.acquire(tokens, [300], 0.0)
    limiter.settle(tokens, [Settlement(first.slot, 300, 250.0)])
    second = limiter.acquire(tokens, [200], 0.0)
    limiter.clamp(tokens, None, 350.0, second.dating(200))
    assert limiter.levels(tokens).refunding
    clock.now = 1.0
    third = limiter.acquire(tokens, [10], 0.0)  # spent from 350 + 10 of refill
    clock.now = 1.5
    # it holds 355; with 5 of refill and no refunds since its admission, anything under
    # 349 contradicts
    limiter.clamp(tokens, None, 343.0, third.dating(10))
    levels = limiter.levels(tokens)
    assert not levels.refunding and levels.tokens <= 343  # spending as if nothing came back

"""The classifier of what bound a job (quotaflow/observe/bound.py), on timelines built by hand."""

from quotaflow.observe.bound import (
    BUDGET,
    PAUSED,
    PROVIDER,
    WORKERS,
    Limits,
    Slice,
    Timeline,
    Use,
    classify,
)

LIMITS = Limits("d1", rpm=60, tpm=1_000_000, burst_s=1, max_concurrency=8)


def timeline(slices: list[Slice], limits: Limits = LIMITS, queued_s: float = 0.5,
             queue: str = "standard", route: list[str] | None = None) -> Timeline:
    return Timeline(queued_s, slices, {limits.name: limits}, queue, route or [limits.name])


def paced(count: int, per_slice: int, flying: float = 1.0, retried: int = 0) -> list[Slice]:
    return [Slice(0.5 + k, 1.0, {"d1": Use(per_slice, 10 * per_slice, 5 * per_slice, retried)},
                  {"d1": flying}) for k in range(count)]


def test_admissions_at_the_refill_rate_after_the_burst_are_budget_bound() -> None:
    # 1 request a second against 60 rpm, for 20 s: the bucket was empty all along
    bound = classify(timeline(paced(20, 1)))
    assert (bound.cause, bound.deployment, bound.dimension) == (BUDGET, "d1", "rpm")
    assert "the budget is the limit" in bound.advice
    assert bound.seconds["budget: d1 rpm"] == 20


def test_a_burst_out_of_full_buckets_is_not_a_budget_wait() -> None:
    # Same pace, but the bucket held 60 at once and only 20 were taken: never drained
    roomy = Limits("d1", rpm=60, tpm=1_000_000, burst_s=60, max_concurrency=8)
    bound = classify(timeline(paced(20, 1), roomy))
    assert bound.cause == WORKERS
    assert "more workers" in bound.advice


def test_the_tokens_limit_named_when_it_binds() -> None:
    tight = Limits("d1", rpm=6000, tpm=900, burst_s=1, max_concurrency=8)
    assert classify(timeline(paced(20, 1), tight)).dimension == "tpm"
    split = Limits("d1", rpm=6000, tpm=0, itpm=100_000, otpm=300, burst_s=1)
    bound = classify(timeline(paced(20, 1), split))
    assert (bound.cause, bound.dimension) == (BUDGET, "otpm")


def test_calls_in_flight_at_max_concurrency_are_provider_bound() -> None:
    roomy = Limits("d1", rpm=60_000, tpm=100_000_000, max_concurrency=8)
    bound = classify(timeline(paced(20, 20, flying=7.8), roomy))
    assert (bound.cause, bound.deployment) == (PROVIDER, "d1")
    assert "max_concurrency (now 8)" in bound.advice


def test_few_calls_in_flight_with_budget_left_are_worker_bound() -> None:
    roomy = Limits("d1", rpm=60_000, tpm=100_000_000, max_concurrency=8)
    bound = classify(timeline(paced(20, 5, flying=2.0), roomy, queued_s=3))
    assert bound.cause == WORKERS
    assert bound.seconds["workers: queued"] == 3


def test_retried_admissions_are_pauses() -> None:
    roomy = Limits("d1", rpm=60_000, tpm=100_000_000, max_concurrency=8)
    bound = classify(timeline(paced(10, 4, flying=1.0, retried=2), roomy))
    assert (bound.cause, bound.deployment) == (PAUSED, "d1")


def test_the_bulk_floor_is_named_when_it_held_back_a_large_part() -> None:
    floored = Limits("d1", rpm=60, tpm=1_000_000, burst_s=30, floor=0.5, max_concurrency=8)
    slices = [Slice(0.5, 1.0, {"d1": Use(15, 0, 0)}, {"d1": 1.0}), *paced(20, 1)[1:]]
    bound = classify(timeline(slices, floored, queue="bulk"))
    assert bound.cause == BUDGET
    assert "floor" in bound.advice and "QUOTAFLOW_FLOOR_BULK" in bound.advice


def test_the_time_after_the_last_admission_is_the_providers() -> None:
    roomy = Limits("d1", rpm=60_000, tpm=100_000_000, max_concurrency=8)
    slices = [*paced(2, 5, flying=2.0),
              *(Slice(2.5 + k, 1.0, {}, {"d1": 1.0}) for k in range(10))]
    bound = classify(timeline(slices, roomy))
    assert bound.cause == PROVIDER and bound.seconds["provider: d1"] == 10


def test_nothing_admitted_yet() -> None:
    bound = classify(timeline([], queued_s=4))
    assert bound.cause == "" and "first batch" in bound.advice
    assert bound.as_json()["shares"] == {"workers: queued": 1.0}

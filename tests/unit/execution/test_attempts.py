"""One admitted item's calls (quotaflow/execution/attempts.py) through Caller.call, with
the in-process limiter and circuit breaker and a scripted provider: a retryable failure
is routed, paid for again and retried; a permanent one is not; the tries end at the
run's max_attempts; a retry is not sent once the job ended; and an admission that went
stale before its call is given back and admitted again."""

import asyncio
from pathlib import Path

from quotaflow.errors import PermanentProviderError, RetryableProviderError
from quotaflow.execution.admitted import Admitted
from quotaflow.execution.attempts import STALE_ADMISSION_S, Caller
from quotaflow.execution.batch import BatchRun
from quotaflow.models import ItemStatus
from quotaflow.providers.base import ProviderResponse
from quotaflow.providers.outcomes import Failure, FailureCode, Outcome, Provenance
from tests.unit.execution.runs import Journal, Parts, Scripted, deployments, items, outcomes
from tests.unit.execution.runs import route as route_of


def _admitted(parts: Parts, run: BatchRun) -> Admitted:
    """The first of a route's items, prepared and paid for as a first admission is."""
    gate = parts.gate()
    choice = gate.choose(route_of(parts.catalog))
    assert choice.deployment is not None
    asked, refused = gate.prepare(run, choice.deployment, items(1))
    assert not refused and gate.acquire(run, asked).admitted == 1
    return asked[0]


def _call(parts: Parts, run: BatchRun,
          stale_by_s: float = 0.0) -> tuple[Outcome, Provenance | None]:
    """Admit the item, `stale_by_s` seconds ago, and call it; its outcome and record."""
    async def scenario() -> None:
        admitted = _admitted(parts, run)
        admitted.admitted_at -= stale_by_s
        await Caller(parts.gate()).call(run, route_of(parts.catalog), admitted)

    asyncio.run(scenario())
    return outcomes(run)[0]


def test_a_retryable_failure_is_admitted_again_and_retried(tmp_path: Path) -> None:
    # Given a provider that is overloaded once, then answers
    journal = Journal()
    provider = Scripted([RetryableProviderError("overloaded", status_code=503)])
    parts = Parts(deployments(tmp_path), provider)
    run = parts.run([journal])
    # When the item is called
    outcome, record = _call(parts, run)
    # Then the retry was paid for again (one re-admission) and its answer kept
    assert isinstance(outcome, ProviderResponse)
    assert provider.calls == 2 and journal.retries == [0]
    assert record is not None and record.attempts == 2 and record.deployment == "one"


def test_a_permanent_failure_is_not_retried(tmp_path: Path) -> None:
    provider = Scripted([PermanentProviderError("bad request", status_code=400)])
    parts = Parts(deployments(tmp_path), provider)
    run = parts.run()
    outcome, record = _call(parts, run)
    assert isinstance(outcome, Failure) and outcome.code == FailureCode.PROVIDER_ERROR
    assert "not retried" in outcome.message and outcome.status_code == 400
    assert provider.calls == 1 and record is not None and record.attempts == 1


def test_the_tries_end_at_the_runs_max_attempts(tmp_path: Path) -> None:
    # Given a provider that is always overloaded and a run allowing 3 attempts
    provider = Scripted([RetryableProviderError("overloaded", status_code=503)] * 5)
    parts = Parts(deployments(tmp_path), provider)
    run = parts.run(max_attempts=3)
    # When the item is called
    outcome, _ = _call(parts, run)
    # Then it gave up after the third call, saying so
    assert isinstance(outcome, Failure) and "gave up after 3 attempts" in outcome.message
    assert provider.calls == 3


def test_no_retry_is_sent_once_the_job_was_cancelled(tmp_path: Path) -> None:
    # Given a first call that fails, in a job cancelled meanwhile
    provider = Scripted([RetryableProviderError("overloaded", status_code=503)])
    parts = Parts(deployments(tmp_path), provider)
    run = parts.run()
    run.watch.status = ItemStatus.CANCELLED  # type: ignore[attr-defined]
    # When the item is called
    outcome, _ = _call(parts, run)
    # Then the retry was not sent: the item ends cancelled, naming why
    assert isinstance(outcome, Failure) and "not sent again" in outcome.message
    assert provider.calls == 1


def test_an_admission_gone_stale_before_its_call_is_admitted_again(tmp_path: Path) -> None:
    # Given an item admitted longer ago than a request's travel (its process was stopped)
    journal = Journal()
    provider = Scripted()
    parts = Parts(deployments(tmp_path), provider)
    run = parts.run([journal])
    # When it is called
    outcome, record = _call(parts, run, stale_by_s=2 * STALE_ADMISSION_S)
    # Then it was admitted again before the one call was sent, which counts as its first
    assert isinstance(outcome, ProviderResponse)
    assert journal.retries == [0] and provider.calls == 1
    assert record is not None and record.attempts == 1

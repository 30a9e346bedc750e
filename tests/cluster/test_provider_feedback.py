"""Provider feedback: when the provider's real limit is tighter than the deployments
file says, its 429s lower the budget to what it says remains and pause the deployment
until Retry-After instead of storming it; a 429 that is not the budget running out
costs its own request a retry and nothing more."""

import io
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from quotaflow.budget.buckets import LocalLimiter
from quotaflow.deployments.limits import Budget
from quotaflow.execution import BatchExecutor
from quotaflow.ingest import pipeline
from quotaflow.jobs import service as jobs
from tests.harness.cluster import start_provider
from tests.harness.factories import chat_line, jsonl


@pytest.fixture
def strict_provider(tmp_path: Path) -> Iterator[str]:
    """A provider that really allows one request a second (60 RPM over 1 s windows)."""
    proc, url = start_provider(tmp_path, "--rpm", "60", "--tpm", "1000000",
                               "--burst-seconds", "1", "--latency-ms", "0")
    try:
        yield url
    finally:
        proc.stop()


OPTIMISTIC = Budget("optimistic", 6000, 1_000_000, 1)


def run_job(pg_sessions, settings, tmp_path: Path, provider: str, items: int,
            attempts: int) -> tuple[str, LocalLimiter, object]:
    """Run a job against a deployment that overstates the provider's limit a hundredfold."""
    (tmp_path / "d.toml").write_text(
        f'[deployments.optimistic]\nprovider = "openai"\nbase_url = "{provider}/v1"\n'
        'model = "m"\nrpm = 6000\ntpm = 1000000\nburst_seconds = 1\n[routes]\n"*" = "optimistic"\n')
    settings.deployments_file = tmp_path / "d.toml"
    settings.provider_max_attempts = attempts
    collected = []

    class Collect:
        def dispatch(self, queue: str, batches: list) -> None:
            collected.extend(batches)

    data = io.BytesIO(jsonl([chat_line(f"r{i}") for i in range(items)]))
    job = pipeline.create_job_in_process(
        pg_sessions, data, settings=settings, deployments=settings.load_deployments(),
        dispatcher=Collect(), queue="realtime")
    limiter = LocalLimiter()
    executor = BatchExecutor(pg_sessions, settings.load_deployments(), limiter, settings,
                             defer=False)
    return job.id, limiter, executor.run(collected[0])


def test_a_429_blocks_the_deployment_until_retry_after(pg_sessions, settings, tmp_path,
                                                       strict_provider: str) -> None:
    # When two requests go out at once and the provider takes only one
    _, limiter, report = run_job(pg_sessions, settings, tmp_path, strict_provider, 2, 1)
    # Then the refused one fails (no retries allowed here), and the whole deployment is
    # paused for the provider's Retry-After (1 s), its requests bucket lowered to what
    # the provider's headers say remains (none; refilling since, at 100 a second, for
    # less than half a second)
    assert (report.succeeded, report.failed) == (1, 1)
    levels = limiter.levels(OPTIMISTIC)
    assert 0.5 < levels.blocked_s <= 1.0
    assert levels.requests < OPTIMISTIC.request_capacity / 2
    assert limiter.acquire(OPTIMISTIC, [10], 0.0).wait_s > 0.5


def test_a_429_that_is_not_the_budget_costs_only_its_retry(pg_sessions, settings,
                                                          tmp_path: Path) -> None:
    # Given a provider that answers every request 429, without rate-limit headers (an
    # overloaded server, not a spent budget)
    proc, url = start_provider(tmp_path, "--rpm", "60000", "--tpm", "100000000",
                               "--latency-ms", "0", "--fault", "429=1.0")
    try:
        _, limiter, report = run_job(pg_sessions, settings, tmp_path, url, 1, 1)
    finally:
        proc.stop()
    # Then the deployment is neither paused nor drained: its budget stays as it was
    # (less the one request, which the provider may have counted)
    assert report.failed == 1
    levels = limiter.levels(OPTIMISTIC)
    assert levels.blocked_s == 0
    assert levels.requests >= OPTIMISTIC.request_capacity - 1.01
    assert levels.tokens >= OPTIMISTIC.token_capacity * 0.99


def test_429s_are_retried_without_a_storm(pg_sessions, settings, tmp_path,
                                          strict_provider: str) -> None:
    # When four requests meet a provider that takes one a second
    job_id, _, report = run_job(pg_sessions, settings, tmp_path, strict_provider, 4, 10)
    # Then every request succeeds, and the provider saw a few 429s, not a storm: after each,
    # nothing was sent until its Retry-After (1 s) had passed
    assert report.succeeded == 4
    stats = httpx.get(f"{strict_provider}/stats").json()
    assert stats["admitted"] == 4 and stats["duplicate_bodies"] == 0
    assert 1 <= stats["rejected_429"] <= 8, stats
    assert stats["last_admitted_at"] - stats["first_admitted_at"] >= 2.9  # one a second
    with pg_sessions() as session:
        assert jobs.get_job(session, job_id).status == "completed"

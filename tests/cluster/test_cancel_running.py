"""A claimed batch stops sending within a second of its job being cancelled or expiring:
calls already sent finish and keep their results, the rest end as batch_cancelled or
batch_expired."""

import io
import json
import threading
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import update

from quotaflow.budget.buckets import LocalLimiter
from quotaflow.dispatch.queues import BatchRef
from quotaflow.execution import BatchExecutor
from quotaflow.ingest import pipeline
from quotaflow.jobs import service as jobs
from quotaflow.models import Job, JobStatus
from quotaflow.results import output
from tests.harness.factories import chat_line, jsonl

LINES = 200


def _run_in_background(pg_sessions, settings, tmp_path: Path, provider: str):
    (tmp_path / "d.toml").write_text(
        f'[deployments.slow]\nprovider = "openai"\nbase_url = "{provider}/v1"\nmodel = "m"\n'
        'rpm = 600000\ntpm = 100000000\nmax_concurrency = 4\n[routes]\n"*" = "slow"\n')
    settings.deployments_file = tmp_path / "d.toml"
    settings.batch_size = LINES
    batches: list[BatchRef] = []

    class Collect:
        def dispatch(self, queue: str, refs: list[BatchRef]) -> None:
            batches.extend(refs)

    job = pipeline.create_job_in_process(
        pg_sessions, io.BytesIO(jsonl([chat_line(f"c{i}") for i in range(LINES)])),
        settings=settings, deployments=settings.load_deployments(), dispatcher=Collect(),
        queue="realtime")
    executor = BatchExecutor(pg_sessions, settings.load_deployments(), LocalLimiter(), settings)
    reports = []
    thread = threading.Thread(target=lambda: reports.append(executor.run(batches[0])))
    thread.start()
    return job.id, thread, reports


def _errors(pg_sessions, job_id: str) -> list[dict]:
    with pg_sessions() as session:
        return [json.loads(line) for line in output.iter_output(session, job_id, errors=True)]


@pytest.mark.parametrize("how", ["cancel", "expire", "window"])
def test_a_claimed_batch_stops_sending_soon_after_its_job_ends(
        pg_sessions, settings, tmp_path, slow_provider, how: str) -> None:
    # Given one batch of 200 claimed and running, 4 calls of 100 ms at a time (5 s in all)
    job_id, thread, reports = _run_in_background(pg_sessions, settings, tmp_path,
                                                 slow_provider)
    time.sleep(1.0)
    # When its job is cancelled, or expired by the reaper, or its window just ends
    ended_at = time.time()
    if how == "cancel":
        jobs.cancel_job(pg_sessions, job_id)
    else:
        with pg_sessions.begin() as session:
            session.execute(update(Job).where(Job.id == job_id)
                            .values(expires_at=Job.created_at))
        if how == "expire":  # the reaper's round; "window": the batch sees it by itself
            assert jobs.expire_overdue(pg_sessions) == [job_id]
    thread.join(30)
    # Then nothing was admitted by the provider more than 1.5 s later
    stats = httpx.get(f"{slow_provider}/stats").json()
    assert stats["last_admitted_at"] < ended_at + 1.5, stats["last_admitted_at"] - ended_at
    # And every line is accounted for once: answered before the end, or not sent and
    # listed with the job's reason
    [report] = reports
    code = "batch_cancelled" if how == "cancel" else "batch_expired"
    errors = _errors(pg_sessions, job_id)
    assert {e["error"]["code"] for e in errors} == {code}
    assert 0 < report.succeeded < LINES / 2
    assert report.succeeded + len(errors) == LINES
    assert stats["admitted"] == report.succeeded
    with pg_sessions() as session:
        status = jobs.get_job(session, job_id).status
    assert status == (JobStatus.CANCELLED if how == "cancel" else JobStatus.EXPIRED)


def test_a_batch_goes_on_at_once_when_its_probe_closes_the_circuit(
        pg_sessions, settings, tmp_path, slow_provider) -> None:
    # Given a deployment whose circuit opened and whose cooldown has just passed
    (tmp_path / "d.toml").write_text(
        f'[deployments.slow]\nprovider = "openai"\nbase_url = "{slow_provider}/v1"\n'
        'model = "m"\nrpm = 600000\ntpm = 100000000\nmax_concurrency = 4\n'
        'circuit_failures = 1\ncircuit_cooldown_s = 0.2\n[routes]\n"*" = "slow"\n')
    settings.deployments_file = tmp_path / "d.toml"
    settings.batch_size = 20
    deployments = settings.load_deployments()
    batches: list[BatchRef] = []

    class Collect:
        def dispatch(self, queue: str, refs: list[BatchRef]) -> None:
            batches.extend(refs)

    job = pipeline.create_job_in_process(
        pg_sessions, io.BytesIO(jsonl([chat_line(f"p{i}") for i in range(20)])), settings=settings,
        deployments=deployments, dispatcher=Collect(), queue="realtime")
    executor = BatchExecutor(pg_sessions, deployments, LocalLimiter(), settings)
    executor.breaker.record_failure(deployments.deployments["slow"])
    time.sleep(0.3)
    # When a batch runs: its first call is the probe (100 ms), and it succeeds
    started = time.monotonic()
    report = executor.run(batches[0])
    took = time.monotonic() - started
    # Then the rest of the batch follows at once, not after the probe's timeout (65 s)
    assert report.retry_in is None, report
    assert report.succeeded == 20, report
    assert took < 5, took
    with pg_sessions() as session:
        assert jobs.get_job(session, job.id).status == JobStatus.COMPLETED

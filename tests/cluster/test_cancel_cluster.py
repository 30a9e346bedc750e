"""Stop means stop, on a cluster: four workers against a throttled strict provider.

The provider admits 10 requests/s (rpm 600 enforced per second), so most of a
600-line job is always waiting for budget in claimed batches. A cancel, or the end
of the job's completion window, must stop every admission within 2 s, wherever
the unsent lines are (pending, claimed, waiting for budget, deferred), and list
each of them in the error file with the job's reason.
"""

import io
import json
import time
from pathlib import Path

import httpx
import pytest

from quotaflow.config import Settings
from quotaflow.ingest import pipeline
from quotaflow.jobs import service as jobs
from quotaflow.models import JobStatus
from quotaflow.results import output
from tests.harness.cluster import (
    deployment_file,
    job_status,
    results_stored,
    start_provider,
    start_workers,
)
from tests.harness.factories import chat_line, jsonl
from tests.harness.servers import REDIS_URL, service_env
from workers.dispatch import CeleryDispatcher

LINES = 600
STOP_WITHIN_S = 2.0

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("how", ["cancel", "window"])
def test_no_admission_later_than_two_seconds_after_a_job_ends(
        pg_url: str, pg_sessions, redis_url: str, tmp_path: Path, how: str) -> None:
    procs = []
    try:
        # Given a provider admitting 10 requests/s and a deployment that knows it
        provider, provider_url = start_provider(tmp_path, "--rpm", "600", "--tpm", "10000000",
                                                "--burst-seconds", "1", "--latency-ms", "100")
        procs.append(provider)
        deployments = deployment_file(tmp_path, "throttled", provider_url, rpm=600,
                                      burst_seconds=1)
        env = service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                          QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments))
        procs += start_workers(env, tmp_path, how, count=4)
        window = 15 if how == "window" else 24 * 3600
        settings = Settings(database_url=pg_url, broker_url=REDIS_URL,
                            deployments_file=deployments, completion_window_s=window,
                            _env_file=None)
        job = pipeline.create_job_in_process(
            pg_sessions, io.BytesIO(jsonl([chat_line(f"s{i}") for i in range(LINES)])),
            settings=settings, deployments=settings.load_deployments(),
            dispatcher=CeleryDispatcher(REDIS_URL), queue="standard")
        # When it is cancelled at a quarter done, or its window ends (15 s: about 150 sent)
        if how == "cancel":
            deadline = time.monotonic() + 60
            while results_stored(pg_sessions, job.id) < LINES // 4:
                assert time.monotonic() < deadline, "the job never got going"
                time.sleep(0.05)
            ended_at = time.time()
            jobs.cancel_job(pg_sessions, job.id)
        else:
            assert job.expires_at is not None
            ended_at = job.expires_at.timestamp()
        deadline = time.monotonic() + 60
        while (status := job_status(pg_sessions, job.id)) in ("in_progress", "cancelling"):
            assert time.monotonic() < deadline, f"still {status} a minute later"
            time.sleep(0.2)
        time.sleep(1.0)  # anything still to be admitted would be by now
        stats = httpx.get(f"{provider_url}/stats").json()
    finally:
        for proc in reversed(procs):
            proc.stop()
    # Then the job ended as asked, and nothing was admitted 2 s after the end
    assert status == (JobStatus.CANCELLED if how == "cancel" else JobStatus.EXPIRED)
    late = stats["last_admitted_at"] - ended_at
    assert late <= STOP_WITHIN_S, f"an admission {late:.2f} s after the job ended"
    # And every line is accounted for once: its answer, or its line in the error file
    # with the job's reason
    code = "batch_cancelled" if how == "cancel" else "batch_expired"
    with pg_sessions() as session:
        answered = [json.loads(line)["custom_id"]
                    for line in output.iter_output(session, job.id, errors=False)]
        errors = [json.loads(line) for line in output.iter_output(session, job.id, errors=True)]
    assert {error["error"]["code"] for error in errors} == {code}
    assert sorted(answered + [error["custom_id"] for error in errors]) == sorted(
        f"s{i}" for i in range(LINES))
    assert stats["admitted"] == len(answered)
    assert 0 < len(answered) < LINES / 2

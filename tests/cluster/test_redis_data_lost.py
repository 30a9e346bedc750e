"""Redis loses its data while its process lives on (an operator's FLUSHDB, another
application's FLUSHALL, eviction under maxmemory): the queued messages and the budget go,
the broker's run id stays. The job must resume within 30 s, send nothing twice, and the
budget that comes back must not be a full one while the provider's is spent.
"""

import io
import time
from pathlib import Path

import httpx
import pytest

from quotaflow.config import Settings
from quotaflow.db import session_factory
from quotaflow.ingest import pipeline
from tests.harness.cluster import (
    deployment_file,
    one_result_per_line,
    output_ids,
    results_stored,
    start_provider,
    start_workers,
    wait_until_finished,
)
from tests.harness.factories import chat_line, jsonl
from tests.harness.servers import flush_redis, service_env
from workers.dispatch import CeleryDispatcher

pytestmark = pytest.mark.timeout(240)

LINES = 240
# The provider and the deployment alike: 100 requests at once, then 20 a second.
RPM, BURST_S = 1200, 5


def test_flushdb_mid_job_resumes_within_30s_without_429s_or_repeats(
        pg_url: str, pg_sessions, tmp_path: Path, throwaway_redis) -> None:
    # Given four workers whose broker and limiter live on a Redis of the test's own, at a
    # provider whose budget the job spends to the last request
    redis_url, _, _ = throwaway_redis
    sessions = session_factory(pg_url)
    procs = []
    try:
        provider, provider_url = start_provider(
            tmp_path, "--rpm", str(RPM), "--tpm", "100000000", "--burst-seconds", str(BURST_S),
            "--latency-ms", "200", "--no-reconcile")
        procs.append(provider)
        deployments = deployment_file(tmp_path, "strict", provider_url, rpm=RPM,
                                      burst_seconds=BURST_S)
        env = service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=redis_url,
                          QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments))
        procs += start_workers(env, tmp_path, "flushed", count=4)
        # (default reaper interval and queue patience: an hour, so waiting it out fails)
        settings = Settings(database_url=pg_url, broker_url=redis_url, batch_size=5,
                            deployments_file=deployments, _env_file=None)
        job = pipeline.create_job_in_process(pg_sessions, io.BytesIO(jsonl([chat_line(f"q{i}")
                                                            for i in range(LINES)])),
                              settings=settings, deployments=settings.load_deployments(),
                              dispatcher=CeleryDispatcher(redis_url), queue="standard")
        # When the job's Redis db is flushed once the provider's first bucket is spent
        deadline = time.monotonic() + 60
        while results_stored(sessions, job.id) < 110:
            assert time.monotonic() < deadline, "the job never got going"
            time.sleep(0.1)
        flush_redis(redis_url)
        flushed = time.monotonic()
        # Then the lost messages are queued again within 30 s (not after the hour of
        # patience: the run id did not change) and the job completes
        done = results_stored(sessions, job.id)
        while results_stored(sessions, job.id) == done:
            assert time.monotonic() - flushed < 30, "nothing resumed within 30 s"
            time.sleep(0.2)
        status = wait_until_finished(sessions, job.id, flushed, 90, LINES)
        stats = httpx.get(f"{provider_url}/stats").json()
    finally:
        for proc in reversed(procs):
            proc.stop()
    assert status == "completed"
    assert one_result_per_line(sessions, job.id) == (LINES, LINES)
    assert output_ids(sessions, job.id) == [f"q{i}" for i in range(LINES)]
    # the budget came back empty, not full: the provider refused nothing
    assert stats["rejected_429"] == 0
    # and nothing was sent twice: the calls in flight finished where they were
    assert stats["max_calls_per_body"] == 1

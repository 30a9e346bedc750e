"""Chaos: the broker's Redis restarts empty mid-job; queued messages are gone, nothing else is."""

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
from tests.harness.servers import service_env
from workers.dispatch import CeleryDispatcher

pytestmark = pytest.mark.timeout(240)


def test_redis_restart_loses_nothing(pg_url: str, pg_sessions, tmp_path: Path,
                                     throwaway_redis) -> None:
    # Given workers whose broker and limiter live on a Redis that keeps nothing on disk
    redis_url, start_redis, stop_redis = throwaway_redis
    sessions = session_factory(pg_url)
    procs = []
    try:
        provider, provider_url = start_provider(tmp_path, "--rpm", "60000", "--tpm", "10000000",
                                                "--latency-ms", "500")
        procs.append(provider)
        deployments = deployment_file(tmp_path, "slow", provider_url)
        env = service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=redis_url,
                          QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments),
                          QUOTAFLOW_REAP_INTERVAL_S="1")
        workers = start_workers(env, tmp_path, "redis")
        procs += workers
        # (the default queue patience, an hour: only noticing the restart can resume it)
        settings = Settings(database_url=pg_url, broker_url=redis_url, batch_size=5,
                            deployments_file=deployments, _env_file=None)
        job = pipeline.create_job_in_process(
            pg_sessions, io.BytesIO(jsonl([chat_line(f"q{i}") for i in range(120)])),
            settings=settings, deployments=settings.load_deployments(),
            dispatcher=CeleryDispatcher(redis_url), queue="standard")
        # When Redis goes away mid-job and comes back empty
        deadline = time.monotonic() + 60
        while results_stored(sessions, job.id) < 10:
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.2)
        stop_redis()
        time.sleep(2)
        start_redis()
        # Then the job resumes at once: the reaper sees the broker's run id change and
        # sends the lost messages again (not after the hour of queue patience). Celery
        # can end a worker on the lost connection (a race in kombu's Redis transport it
        # calls unrecoverable); as in compose, a restart policy starts it again.
        status = wait_until_finished(sessions, job.id, time.monotonic(), 60, 120,
                                     restarted=workers)
        stats = httpx.get(f"{provider_url}/stats").json()
    finally:
        for proc in reversed(procs):
            proc.stop()
    assert status == "completed"
    assert one_result_per_line(sessions, job.id) == (120, 120)
    assert output_ids(sessions, job.id) == [f"q{i}" for i in range(120)]
    assert stats["max_calls_per_body"] <= 2  # only calls in flight at the restart may repeat

"""Chaos: PostgreSQL restarts mid-job; the job completes with one result per line."""

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
from tests.harness.servers import REDIS_URL, flush_redis, service_env
from workers.dispatch import CeleryDispatcher

pytestmark = pytest.mark.timeout(240)


def test_postgres_restart_loses_nothing(tmp_path: Path, throwaway_postgres) -> None:
    # Given workers whose database is a PostgreSQL we may restart, on the default leases
    # (lost messages would wait an hour: the job can only finish if batches retry by
    # themselves)
    pg_url, start_pg, stop_pg = throwaway_postgres
    flush_redis(REDIS_URL)
    sessions = session_factory(pg_url)
    procs = []
    try:
        provider, provider_url = start_provider(tmp_path, "--rpm", "60000", "--tpm", "10000000",
                                                "--latency-ms", "500")
        procs.append(provider)
        deployments = deployment_file(tmp_path, "slow", provider_url)
        env = service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                          QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments),
                          QUOTAFLOW_REAP_INTERVAL_S="1")
        procs += start_workers(env, tmp_path, "pg")
        settings = Settings(database_url=pg_url, broker_url=REDIS_URL, batch_size=5,
                            deployments_file=deployments, _env_file=None)
        job = pipeline.create_job_in_process(
            sessions, io.BytesIO(jsonl([chat_line(f"p{i}") for i in range(120)])),
            settings=settings, deployments=settings.load_deployments(),
            dispatcher=CeleryDispatcher(REDIS_URL), queue="standard")
        # When PostgreSQL stops mid-job for five seconds
        deadline = time.monotonic() + 60
        while results_stored(sessions, job.id) < 10:
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.2)
        stop_pg()
        time.sleep(5)
        start_pg()
        # Then the job completes: batches that met the outage are retried with backoff
        status = wait_until_finished(sessions, job.id, time.monotonic(), 120, 120)
        stats = httpx.get(f"{provider_url}/stats").json()
    finally:
        for proc in reversed(procs):
            proc.stop()
    assert status == "completed"
    assert one_result_per_line(sessions, job.id) == (120, 120)
    assert output_ids(sessions, job.id) == [f"p{i}" for i in range(120)]
    sessions.kw["bind"].dispose()
    # And no request was sent twice: answers that came while the database was away were
    # kept and stored once it was back
    assert stats["duplicate_bodies"] == 0, stats

"""Chaos: a whole worker killed with SIGKILL mid-job loses nothing and duplicates nothing."""

import io
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from quotaflow.config import Settings
from quotaflow.db import session_factory
from quotaflow.ingest import pipeline
from quotaflow.models import Item
from tests.harness.cluster import (
    deployment_file,
    one_result_per_line,
    output_ids,
    start_provider,
    start_workers,
    wait_until_finished,
)
from tests.harness.factories import chat_line, jsonl
from tests.harness.servers import REDIS_URL, flush_redis, service_env
from workers.dispatch import CeleryDispatcher


def test_sigkilled_worker_loses_nothing(pg_url: str, pg_sessions, tmp_path: Path) -> None:
    # Given a slow provider (1 s a request), two workers, short leases and patience, and a
    # fast reaper
    flush_redis(REDIS_URL)
    sessions = session_factory(pg_url)
    procs = []
    try:
        provider, provider_url = start_provider(tmp_path, "--rpm", "60000", "--tpm", "10000000",
                                                "--latency-ms", "1000")
        procs.append(provider)
        deployments = deployment_file(tmp_path, "slow", provider_url)
        env = service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                          QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments),
                          QUOTAFLOW_LEASE_S="4", QUOTAFLOW_QUEUE_PATIENCE_S="5",
                          QUOTAFLOW_REAP_INTERVAL_S="1")
        workers = start_workers(env, tmp_path, "chaos")
        procs += workers
        # A message the killed worker had received but not yet claimed is only found
        # by the queue patience, so it is short here too.
        settings = Settings(database_url=pg_url, broker_url=REDIS_URL, batch_size=5,
                            queue_patience_s=5, deployments_file=deployments, _env_file=None)
        job = pipeline.create_job_in_process(
            pg_sessions, io.BytesIO(jsonl([chat_line(f"c{i}") for i in range(100)])),
            settings=settings, deployments=settings.load_deployments(),
            dispatcher=CeleryDispatcher(REDIS_URL), queue="standard")
        # When the first worker is killed outright while it holds claimed items
        deadline = time.monotonic() + 60
        while not _claimed_by_both(sessions, job.id):
            assert time.monotonic() < deadline, "the workers never both held items"
            time.sleep(0.05)
        os.killpg(workers[0].pid, signal.SIGKILL)
        # Then the survivor finishes the job, well before Redis would redeliver (1 h)
        status = wait_until_finished(sessions, job.id, time.monotonic(), 90, 100)
        stats = httpx.get(f"{provider_url}/stats").json()
    finally:
        for proc in reversed(procs):
            proc.stop()
    assert status == "completed"
    assert one_result_per_line(sessions, job.id) == (100, 100)
    assert output_ids(sessions, job.id) == [f"c{i}" for i in range(100)]
    # Only the calls the dead worker had in flight may have reached the provider twice
    assert stats["max_calls_per_body"] <= 2
    assert stats["duplicate_bodies"] <= 10  # at most its two batches in flight
    survivor_log = workers[1].log_path.read_text(errors="replace")
    assert "items of dead workers or lost messages queued again" in survivor_log


def _claimed_by_both(sessions, job_id: str) -> bool:
    with sessions() as session:
        owners = session.scalars(select(func.count(func.distinct(Item.lease_owner)))
                                 .where(Item.job_id == job_id, Item.status == "running")).one()
    return owners >= 3  # four slots, two a worker: both workers hold items


pytestmark = pytest.mark.timeout(240)

"""A worker that pauses longer than its lease and comes back (a paused VM, a long GC or swap
stall): its items pass to other workers meanwhile, and on waking it must not send them
again. Only calls already on the wire when it froze may reach the provider twice.
"""

import io
import os
import signal
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
    results_stored,
    start_provider,
    start_workers,
    wait_until_finished,
)
from tests.harness.factories import chat_line, jsonl
from tests.harness.servers import REDIS_URL, service_env
from workers.dispatch import CeleryDispatcher

pytestmark = pytest.mark.timeout(240)

LINES, BATCH = 600, 50
RPM, BURST_S = 1200, 5  # 100 requests at once, then 20 a second: about 25 s of work
WORKERS, CONCURRENCY, MAX_CONCURRENCY = 4, 2, 16
LEASE_S = 6


def test_a_worker_frozen_past_its_lease_does_not_send_its_items_again(
        pg_url: str, pg_sessions, redis_url: str, tmp_path: Path) -> None:
    sessions = session_factory(pg_url)
    procs = []
    try:
        provider, provider_url = start_provider(
            tmp_path, "--rpm", str(RPM), "--tpm", "100000000", "--burst-seconds", str(BURST_S),
            "--latency-ms", "200", "--no-reconcile")
        procs.append(provider)
        deployments = deployment_file(tmp_path, "strict", provider_url, rpm=RPM,
                                      burst_seconds=BURST_S)
        env = service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                          QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments),
                          QUOTAFLOW_LEASE_S=str(LEASE_S), QUOTAFLOW_REAP_INTERVAL_S="1")
        workers = start_workers(env, tmp_path, "paused", count=WORKERS,
                                concurrency=CONCURRENCY)
        procs += workers
        settings = Settings(database_url=pg_url, broker_url=redis_url, batch_size=BATCH,
                            deployments_file=deployments, _env_file=None)
        job = pipeline.create_job_in_process(
            pg_sessions, io.BytesIO(jsonl([chat_line(f"p{i}", prompt=f"q {i}")
                                           for i in range(LINES)])),
            settings=settings, deployments=settings.load_deployments(),
            dispatcher=CeleryDispatcher(redis_url), queue="standard")
        # When one worker (its main process and its pool) freezes at 30% done for twice
        # its lease, then carries on
        deadline = time.monotonic() + 60
        while results_stored(sessions, job.id) < LINES * 0.3:
            assert time.monotonic() < deadline, "the job never got going"
            time.sleep(0.1)
        frozen = workers[0]
        os.killpg(frozen.pid, signal.SIGSTOP)
        time.sleep(2 * LEASE_S)
        os.killpg(frozen.pid, signal.SIGCONT)
        status = wait_until_finished(sessions, job.id, time.monotonic(), 120, LINES)
        stats = httpx.get(f"{provider_url}/stats").json()
    finally:
        for proc in reversed(procs):
            proc.stop()
    assert status == "completed"
    assert one_result_per_line(sessions, job.id) == (LINES, LINES)
    # Then the provider saw twice only what was in flight when it froze: at most each of
    # its pool's batch runs' max_concurrency
    assert stats["duplicate_bodies"] <= CONCURRENCY * MAX_CONCURRENCY, stats

"""Chaos: a whole worker killed with SIGKILL mid-job loses nothing and duplicates nothing."""

import io
import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
import redis
from sqlalchemy import func, select

from api.dispatch import CeleryDispatcher
from quotaflow import jobs
from quotaflow.config import Settings
from quotaflow.db import session_factory
from quotaflow.models import Item, Result
from tests.conftest import REDIS_URL, service_env
from tests.factories import chat_line, jsonl
from tests.procs import Proc, free_port, quotaflow


def test_sigkilled_worker_loses_nothing(pg_url: str, pg_sessions, tmp_path: Path) -> None:
    # Given a slow provider (1 s a request), two workers, short leases and patience, and a
    # fast reaper
    redis.Redis.from_url(REDIS_URL).flushdb()
    port = free_port()
    procs = [Proc("provider", quotaflow("mock-provider", "--port", str(port), "--rpm", "60000",
                                        "--tpm", "10000000", "--latency-ms", "1000"),
                  service_env(), tmp_path)]
    (tmp_path / "d.toml").write_text(
        f'[deployments.slow]\nprovider = "openai"\nbase_url = "http://127.0.0.1:{port}/v1"\n'
        'model = "slow"\nrpm = 60000\ntpm = 10000000\n[routes]\n"*" = "slow"\n')
    env = service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                      QUOTAFLOW_DEPLOYMENTS_FILE=str(tmp_path / "d.toml"),
                      QUOTAFLOW_LEASE_SECONDS="4", QUOTAFLOW_QUEUE_PATIENCE_S="5",
                      QUOTAFLOW_REAP_INTERVAL_S="1")
    try:
        procs[0].wait_http(f"http://127.0.0.1:{port}/healthz")
        workers = [Proc(f"worker{n}", quotaflow("worker", "--concurrency", "2", "--name",
                                                f"chaos{n}@qftest"), env, tmp_path)
                   for n in (1, 2)]
        procs += workers
        for worker in workers:
            worker.wait_until(lambda w=worker: " ready." in w.log())
        # A message the killed worker had received but not yet claimed is only found
        # by the queue patience, so it is short here too.
        settings = Settings(database_url=pg_url, broker_url=REDIS_URL, batch_size=5,
                            queue_patience_s=5, deployments_file=tmp_path / "d.toml",
                            _env_file=None)
        job = jobs.create_job(pg_sessions, io.BytesIO(jsonl([chat_line(f"c{i}")
                                                            for i in range(100)])),
                              settings=settings, deployments=settings.load_deployments(),
                              dispatcher=CeleryDispatcher(REDIS_URL), queue="standard")
        sessions = session_factory(pg_url)
        # When the first worker is killed outright while it holds claimed items
        deadline = time.monotonic() + 60
        while not _claimed_by_both(sessions, job.id):
            assert time.monotonic() < deadline, "the workers never both held items"
            time.sleep(0.05)
        os.killpg(workers[0].pid, signal.SIGKILL)
        killed_at = time.monotonic()
        # Then the survivor finishes the job, well before Redis would redeliver (1 h)
        while (status := _status(sessions, job.id)) == "in_progress":
            assert time.monotonic() - killed_at < 90, "job not finished 90 s after the kill"
            time.sleep(0.5)
        assert status == "completed"
        stats = httpx.get(f"http://127.0.0.1:{port}/stats").json()
    finally:
        for proc in reversed(procs):
            proc.stop()
    with sessions() as session:
        per_line = session.execute(select(Result.line_no, func.count())
                                   .where(Result.job_id == job.id).group_by(Result.line_no)).all()
        lines = [json.loads(line) for line in jobs.iter_output(session, job.id, errors=False)]
    assert sorted(per_line) == [(n, 1) for n in range(1, 101)]  # one result per line
    assert [line["custom_id"] for line in lines] == [f"c{i}" for i in range(100)]
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


def _status(sessions, job_id: str) -> str:
    with sessions() as session:
        return jobs.get_job(session, job_id).status


pytestmark = pytest.mark.timeout(240)

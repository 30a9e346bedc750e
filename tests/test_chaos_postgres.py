"""Chaos: PostgreSQL restarts mid-job; the job completes with one result per line."""

import io
import json
import time
from pathlib import Path

import httpx
import pytest
import redis
from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError

from api.dispatch import CeleryDispatcher
from quotaflow import jobs
from quotaflow.config import Settings
from quotaflow.db import session_factory
from quotaflow.models import Result
from tests.conftest import REDIS_URL, service_env
from tests.factories import chat_line, jsonl
from tests.procs import Proc, free_port, quotaflow

pytestmark = pytest.mark.timeout(240)


def test_postgres_restart_loses_nothing(tmp_path: Path, throwaway_postgres) -> None:
    # Given workers whose database is a PostgreSQL we may restart, and short leases (lost
    # messages would wait an hour: the job can only finish if batches retry by themselves)
    pg_url, start_pg, stop_pg = throwaway_postgres
    redis.Redis.from_url(REDIS_URL).flushdb()
    port = free_port()
    procs = [Proc("provider", quotaflow("mock-provider", "--port", str(port), "--rpm", "60000",
                                        "--tpm", "10000000", "--latency-ms", "500"),
                  service_env(), tmp_path)]
    (tmp_path / "d.toml").write_text(
        f'[deployments.slow]\nprovider = "openai"\nbase_url = "http://127.0.0.1:{port}/v1"\n'
        'model = "slow"\nrpm = 60000\ntpm = 10000000\n[routes]\n"*" = "slow"\n')
    env = service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                      QUOTAFLOW_DEPLOYMENTS_FILE=str(tmp_path / "d.toml"),
                      QUOTAFLOW_LEASE_SECONDS="6",
                      QUOTAFLOW_REAP_INTERVAL_S="1")
    sessions = session_factory(pg_url)
    try:
        procs[0].wait_http(f"http://127.0.0.1:{port}/healthz")
        for n in (1, 2):
            procs.append(Proc(f"worker{n}", quotaflow("worker", "--concurrency", "2", "--name",
                                                      f"pg{n}@qftest"), env, tmp_path))
        for worker in procs[1:]:
            worker.wait_until(lambda w=worker: " ready." in w.log())
        settings = Settings(database_url=pg_url, broker_url=REDIS_URL, batch_size=5,
                            deployments_file=tmp_path / "d.toml",
                            _env_file=None)
        job = jobs.create_job(sessions, io.BytesIO(jsonl([chat_line(f"p{i}")
                                                         for i in range(120)])),
                              settings=settings, deployments=settings.load_deployments(),
                              dispatcher=CeleryDispatcher(REDIS_URL), queue="standard")
        # When PostgreSQL stops mid-job for two seconds
        deadline = time.monotonic() + 60
        while _done(sessions, job.id) < 10:
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.2)
        stop_pg()
        time.sleep(2)
        start_pg()
        restarted_at = time.monotonic()
        # Then the job completes: batches that met the outage are retried with backoff
        while _status(sessions, job.id) == "in_progress":
            assert time.monotonic() - restarted_at < 120, (
                f"{_done(sessions, job.id)} of 120 done 120 s after the restart")
            time.sleep(0.5)
        stats = httpx.get(f"http://127.0.0.1:{port}/stats").json()
    finally:
        for proc in reversed(procs):
            proc.stop()
    assert _status(sessions, job.id) == "completed"
    with sessions() as session:
        counts = session.execute(select(func.count(), func.count(func.distinct(Result.line_no)))
                                 .where(Result.job_id == job.id)).one()
        output = [json.loads(line) for line in jobs.iter_output(session, job.id, errors=False)]
    sessions.kw["bind"].dispose()
    assert counts == (120, 120)
    assert [line["custom_id"] for line in output] == [f"p{i}" for i in range(120)]
    assert stats["max_calls_per_body"] <= 2  # only calls in flight at the restart may repeat


def _done(sessions, job_id: str) -> int:
    for _ in range(50):  # the test's own connections see the restart too
        try:
            with sessions() as session:
                return session.scalar(select(func.count()).select_from(Result)
                                      .where(Result.job_id == job_id))
        except OperationalError:
            time.sleep(0.2)
    raise TimeoutError("database did not come back")


def _status(sessions, job_id: str) -> str:
    for _ in range(50):
        try:
            with sessions() as session:
                return jobs.get_job(session, job_id).status
        except OperationalError:
            time.sleep(0.2)
    raise TimeoutError("database did not come back")

"""Chaos: the broker's Redis restarts empty mid-job; queued messages are gone, nothing else is."""

import io
import json
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from api.dispatch import CeleryDispatcher
from quotaflow import jobs
from quotaflow.config import Settings
from quotaflow.db import session_factory
from quotaflow.models import Result
from tests.conftest import service_env
from tests.factories import chat_line, jsonl
from tests.procs import Proc, free_port, quotaflow

pytestmark = pytest.mark.timeout(240)


def test_redis_restart_loses_nothing(pg_url: str, pg_sessions, tmp_path: Path,
                                     throwaway_redis) -> None:
    # Given workers whose broker and limiter live on a Redis that keeps nothing on disk
    redis_url, start_redis, stop_redis = throwaway_redis
    port = free_port()
    procs = [Proc("provider", quotaflow("mock-provider", "--port", str(port), "--rpm", "60000",
                                        "--tpm", "10000000", "--latency-ms", "500"),
                  service_env(), tmp_path)]
    (tmp_path / "d.toml").write_text(
        f'[deployments.slow]\nprovider = "openai"\nbase_url = "http://127.0.0.1:{port}/v1"\n'
        'model = "slow"\nrpm = 60000\ntpm = 10000000\n[routes]\n"*" = "slow"\n')
    env = service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=redis_url,
                      QUOTAFLOW_DEPLOYMENTS_FILE=str(tmp_path / "d.toml"),
                      QUOTAFLOW_QUEUE_PATIENCE_S="5", QUOTAFLOW_REAP_INTERVAL_S="1")
    sessions = session_factory(pg_url)
    try:
        procs[0].wait_http(f"http://127.0.0.1:{port}/healthz")
        for n in (1, 2):
            procs.append(Proc(f"worker{n}", quotaflow("worker", "--concurrency", "2", "--name",
                                                      f"redis{n}@qftest"), env, tmp_path))
        for worker in procs[1:]:
            worker.wait_until(lambda w=worker: " ready." in w.log())
        settings = Settings(database_url=pg_url, broker_url=redis_url, batch_size=5,
                            queue_patience_s=5, deployments_file=tmp_path / "d.toml",
                            _env_file=None)
        job = jobs.create_job(pg_sessions, io.BytesIO(jsonl([chat_line(f"q{i}")
                                                            for i in range(120)])),
                              settings=settings, deployments=settings.load_deployments(),
                              dispatcher=CeleryDispatcher(redis_url), queue="standard")
        # When Redis goes away mid-job and comes back empty
        deadline = time.monotonic() + 60
        while _done(sessions, job.id) < 10:
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.2)
        stop_redis()
        time.sleep(2)
        start_redis()
        restarted_at = time.monotonic()
        # Then the job still completes: lost messages are sent again by the reaper
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
    assert counts == (120, 120)  # one result per line
    assert [line["custom_id"] for line in output] == [f"q{i}" for i in range(120)]
    assert stats["max_calls_per_body"] <= 2  # only calls in flight at the restart may repeat


def _done(sessions, job_id: str) -> int:
    with sessions() as session:
        return session.scalar(select(func.count()).select_from(Result)
                              .where(Result.job_id == job_id))


def _status(sessions, job_id: str) -> str:
    with sessions() as session:
        return jobs.get_job(session, job_id).status

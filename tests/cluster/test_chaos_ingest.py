"""The API killed while it stores a large file: the file is refused or whole, never half.

Ingest is one transaction (quotaflow/ingest/pipeline.py); a server that dies in the
middle of its COPY leaves no job and no item behind, and the same upload sent
again with its Idempotency-Key makes exactly one, whole job.
"""

import contextlib
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from quotaflow.db import get_engine
from tests.harness.chaos_cluster import ROWS
from tests.harness.factories import chat_line, jsonl
from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import REDIS_URL, service_env

LINES = 150_000

pytestmark = pytest.mark.timeout(240)


def _start_api(pg_url: str, tmp_path: Path, name: str) -> tuple[Proc, str]:
    port = free_port()
    env = service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                      QUOTAFLOW_AUTH="false")
    api = Proc(name, quotaflow("api", "--port", str(port)), env, tmp_path)
    url = f"http://127.0.0.1:{port}"
    api.wait_http(f"{url}/healthz")
    return api, url


def _count(pg_url: str, sql: str) -> int:
    with get_engine(pg_url).connect() as conn:
        return conn.execute(text(sql)).scalar_one()


def test_an_api_killed_mid_ingest_leaves_nothing_and_a_retry_makes_one_whole_job(
        pg_url: str, pg_sessions, redis_url: str, tmp_path: Path) -> None:
    data = jsonl([chat_line(f"big{i}", prompt=f"question {i} " + "x" * 300)
                  for i in range(LINES)])
    headers = {"Idempotency-Key": "big-upload-1"}
    api, url = _start_api(pg_url, tmp_path, "api1")
    try:
        # Given a large upload whose rows are being copied into PostgreSQL
        upload = threading.Thread(target=lambda: _post_quietly(url, data, headers))
        upload.start()
        deadline = time.monotonic() + 60
        while not _count(pg_url, "SELECT count(*) FROM pg_stat_activity "
                                 "WHERE query ILIKE 'COPY items%' AND state = 'active'"):
            assert time.monotonic() < deadline, "the API never started copying the file"
            time.sleep(0.02)
        # When the API is killed outright in the middle of it
        os.killpg(api.pid, signal.SIGKILL)
        upload.join(30)
    finally:
        api.stop()
    # Then nothing of the file is stored once PostgreSQL has rolled the copy back
    deadline = time.monotonic() + 30
    while _count(pg_url, "SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'COPY items%'"
                         " AND state <> 'idle'"):
        assert time.monotonic() < deadline, "the dead API's copy never ended"
        time.sleep(0.1)
    assert _count(pg_url, "SELECT count(*) FROM jobs") == 0
    assert _count(pg_url, "SELECT count(*) FROM items") == 0
    assert _count(pg_url, "SELECT count(*) FROM results") == 0
    # And the same upload sent again with its key makes one job, with every line
    restarted = time.monotonic()
    api, url = _start_api(pg_url, tmp_path, "api2")
    try:
        made = httpx.post(f"{url}/jobs", files={"file": ("big.jsonl", data)},
                          headers=headers, timeout=120)
        stored = time.monotonic() - restarted
        again = httpx.post(f"{url}/jobs", files={"file": ("big.jsonl", data)},
                           headers=headers, timeout=120)
    finally:
        api.stop()
    assert made.status_code == 201, made.text
    assert again.json()["id"] == made.json()["id"]
    assert _count(pg_url, "SELECT count(*) FROM jobs") == 1
    assert _count(pg_url, "SELECT count(*) FROM items") == LINES
    # Its row of the reliability table: nothing was sent, so nothing can repeat
    items = _count(pg_url, "SELECT count(DISTINCT custom_id) FROM items")
    ROWS.append(("kill -9 the API mid-ingest", str(LINES - items),
                 str(_count(pg_url, "SELECT count(*) FROM jobs") - 1), "0", "-",
                 f"{stored:.1f}", "- (job stored whole on retry)"))


def _post_quietly(url: str, data: bytes, headers: dict[str, str]) -> None:
    """The upload whose server dies under it: its error is the expected outcome."""
    with contextlib.suppress(httpx.HTTPError):
        httpx.post(f"{url}/jobs", files={"file": ("big.jsonl", data)}, headers=headers,
                   timeout=60)

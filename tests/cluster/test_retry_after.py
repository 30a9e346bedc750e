"""A provider's Retry-After is believed up to QUOTAFLOW_MAX_RETRY_AFTER_S: a 429 asking
for ten minutes holds a request for the ceiling, logged, not for ten minutes."""

import io
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from quotaflow.budget.buckets import LocalLimiter
from quotaflow.dispatch.queues import CollectingDispatcher
from quotaflow.execution import BatchExecutor
from quotaflow.execution.retries import RetryPolicy
from quotaflow.ingest import pipeline
from quotaflow.jobs import service as jobs
from tests.harness.cluster import deployment_file
from tests.harness.factories import chat_line, jsonl
from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import service_env


def test_a_long_wait_is_clamped_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    policy = RetryPolicy(max_wait_s=60)
    with caplog.at_level(logging.WARNING, logger="quotaflow.execution.retries"):
        assert policy.provider_wait(600, "clamped-dep") == 60
        assert policy.provider_wait(601, "clamped-dep") == 60  # logged once a minute
    assert policy.provider_wait(30, "clamped-dep") == 30
    assert policy.provider_wait(None, "clamped-dep") is None
    assert [r.getMessage() for r in caplog.records] == [
        "deployment clamped-dep asked to wait 600 s before the next try; waiting 60 s "
        "(QUOTAFLOW_MAX_RETRY_AFTER_S), the limiter keeps its budget"]
    assert policy.delay(1, 60) == 60  # the retry waits what was kept


@pytest.fixture
def storm(tmp_path: Path) -> Iterator[str]:
    """A strict mock whose every answer is a 429 asking for 600 s, until told otherwise."""
    port = free_port()
    proc = Proc("provider", quotaflow("mock-provider", "--port", str(port), "--rpm", "60000",
                                      "--tpm", "10000000", "--fault", "429=1"),
                service_env(QUOTAFLOW_MOCK_FAULT_RETRY_AFTER_S="600"), tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_http(f"{url}/healthz")
        yield url
    finally:
        proc.stop()


def test_a_429_asking_for_ten_minutes_waits_the_ceiling(pg_sessions, settings, tmp_path,
                                                        storm: str) -> None:
    # Given a provider answering 429 retry-after 600, and a ceiling of 2 s
    settings.deployments_file = deployment_file(tmp_path, "stormy", storm)
    settings.max_retry_after_s = 2.0
    refused = httpx.post(f"{storm}/v1/chat/completions", json=chat_line("probe")["body"])
    assert (refused.status_code, refused.headers["retry-after"]) == (429, "600")
    dispatcher = CollectingDispatcher()
    job = pipeline.create_job_in_process(
        pg_sessions, io.BytesIO(jsonl([chat_line("a"), chat_line("b")])), settings=settings,
        deployments=settings.load_deployments(), dispatcher=dispatcher, queue="realtime",
        max_attempts=3)
    executor = BatchExecutor(pg_sessions, settings.load_deployments(), LocalLimiter(), settings,
                             defer=False)
    # When the storm passes a moment after the first tries
    threading.Timer(0.5, lambda: httpx.put(f"{storm}/faults", json={"429": 0})).start()
    started = time.monotonic()
    for ref in dispatcher.batches:
        executor.run(ref)
    took = time.monotonic() - started
    # Then the retries came after the ceiling, not ten minutes later, and succeeded
    with pg_sessions() as session:
        assert jobs.get_job(session, job.id).status == "completed"
    assert 2.0 <= took < 15, took
    assert httpx.get(f"{storm}/stats").json()["admitted"] == 2

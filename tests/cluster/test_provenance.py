"""Every result says where and how: deployment, calls, admitted/sent/answered, the
provider's request id (tests/unit/observe/test_logs.py: the log lines' context)."""

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.budget.buckets import LocalLimiter
from quotaflow.config import Settings
from quotaflow.dispatch.queues import CollectingDispatcher
from quotaflow.execution import BatchExecutor
from quotaflow.ingest import pipeline
from quotaflow.models import Job, Result
from quotaflow.results import output as downloads
from tests.harness.factories import chat_line, jsonl
from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import service_env


@pytest.fixture
def mock_deployments(tmp_path: Path) -> Iterator[Path]:
    """The strict mock provider over HTTP, failing some calls with 500s (so some lines
    take more than one call), and a deployments file naming it."""
    port = free_port()
    server = Proc("provider", quotaflow("mock-provider", "--port", str(port), "--rpm", "60000",
                                        "--tpm", "10000000", "--latency-ms", "5",
                                        "--fault", "500=0.3"),
                  service_env(), tmp_path)
    try:
        server.wait_http(f"http://127.0.0.1:{port}/healthz")
        path = tmp_path / "d.toml"
        path.write_text(
            f'[deployments.mock-http]\nprovider = "openai"\n'
            f'base_url = "http://127.0.0.1:{port}/v1"\nmodel = "served-model"\n'
            'rpm = 60000\ntpm = 10000000\n'
            '[routes]\n"*" = "mock-http"\n')
        yield path
    finally:
        server.stop()


def run_job(sessions: sessionmaker[Session], settings: Settings, count: int) -> Job:
    """A job of `count` chat lines, every batch run to its end in this process."""
    dispatcher = CollectingDispatcher()
    job = pipeline.create_job_in_process(
        sessions, io.BytesIO(jsonl([chat_line(f"r{i}") for i in range(count)])), settings=settings,
        deployments=settings.load_deployments(), dispatcher=dispatcher, queue="bulk",
        filename="in.jsonl")
    executor = BatchExecutor(sessions, settings.load_deployments(), LocalLimiter(), settings,
                             defer=False)
    for ref in dispatcher.batches:
        executor.run(ref)
    return job


def test_results_say_which_deployment_answered_and_when(pg_sessions, settings,
                                                        mock_deployments) -> None:
    # Given a job of 40 lines against a provider that fails 30% of calls with a 500
    settings.deployments_file = mock_deployments
    settings.provider_max_attempts = 8
    job = run_job(pg_sessions, settings, 40)
    with pg_sessions() as session:
        results = session.scalars(select(Result).where(Result.job_id == job.id)
                                  .order_by(Result.line_no)).all()
        lines = [json.loads(line) for line in downloads.iter_output(session, job.id, False)]
    # Then every result names the deployment, its calls, and times in order
    assert len(results) == 40
    for result in results:
        assert result.deployment == "mock-http"
        assert result.attempts is not None and result.attempts >= 1
        assert result.admitted_at <= result.sent_at <= result.answered_at
        assert result.provider_request_id and result.provider_request_id.startswith("req_")
    assert max(r.attempts for r in results) > 1  # retried lines count every call
    # And each output line keeps our id as `id` and the provider's as response.request_id
    by_line = {r.custom_id: r for r in results}
    for line in lines:
        stored = by_line[line["custom_id"]]
        assert line["id"] == stored.request_id and line["id"].startswith("batch_req_")
        assert line["response"]["request_id"] == stored.provider_request_id

"""Provider batches without servers: the executor queues bulk lines, the loop cuts them
within the provider's limits, survives its crash windows (an upload whose id was never
stored, results downloaded twice) and moves lines to realtime when the window closes.
SQLite and a fake provider client; tests/cluster/test_pbatch_cluster.py runs the real ones."""

import io
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.budget.buckets import LocalLimiter
from quotaflow.config import Settings
from quotaflow.db import session_factory, upgrade
from quotaflow.deployments.catalog import load_deployments
from quotaflow.deployments.deployment import Deployment
from quotaflow.dispatch.queues import BatchRef, CollectingDispatcher
from quotaflow.execution.executor import BatchExecutor
from quotaflow.ingest import pipeline
from quotaflow.jobs import service as jobs
from quotaflow.models import Item, Job, Result, Spend, utcnow
from quotaflow.offload import OWNER
from quotaflow.offload.batch_tables import ProviderBatch, ProviderBatchLine
from quotaflow.offload.clients import Remote, custom_id
from quotaflow.offload.poll_round import ProviderBatchLoop
from quotaflow.offload.results import read_line
from tests.harness.factories import jsonl

TOML = """
[deployments.ob]
provider = "openai-batch"
base_url = "http://127.0.0.1:9/v1"
model = "m"
batch_max_lines = 3
input_per_mtok = 0.5
output_per_mtok = 1.0
[deployments.rt]
provider = "mock"
model = "m"
rpm = 1000000
tpm = 1000000000
[routes]
"m" = { deployments = ["ob"], fallback = ["rt"] }
"""


class FakeBatches:
    """An OpenAI-style Batch API in memory that answers every line at once."""

    def __init__(self) -> None:
        self.submitted: dict[str, list[dict[str, Any]]] = {}
        self.metadata: dict[str, str] = {}
        self.cancelled: list[str] = []
        self.downloads = 0

    def request_line(self, line_no: int, url: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"custom_id": custom_id(line_no), "body": body}

    def find(self, batch_id: str, since: datetime) -> str | None:
        return next((p for p, ours in self.metadata.items() if ours == batch_id), None)

    def submit(self, batch_id: str, url: str, lines: bytes) -> tuple[str, str | None]:
        import orjson

        provider_id = f"pb{len(self.submitted)}"
        self.submitted[provider_id] = [orjson.loads(line) for line in lines.splitlines()]
        self.metadata[provider_id] = batch_id
        return provider_id, None

    def retrieve(self, provider_id: str) -> Remote:
        return Remote(provider_id, "completed", True, "completed", "out", None)

    def cancel(self, provider_id: str) -> None:
        self.cancelled.append(provider_id)

    def results(self, remote: Remote) -> Any:
        self.downloads += 1
        for line in self.submitted[remote.provider_id]:
            yield {"custom_id": line["custom_id"], "response": {
                "status_code": 200, "request_id": "req_1", "body": {
                    "object": "chat.completion", "choices": [],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 4}}}}

    def close(self) -> None:
        pass


@pytest.fixture
def env(tmp_path: Path) -> tuple[sessionmaker[Session], Settings, CollectingDispatcher]:
    url = f"sqlite:///{tmp_path / 'pb.db'}"
    upgrade(url)
    (tmp_path / "d.toml").write_text(TOML)
    settings = Settings(database_url=url, deployments_file=tmp_path / "d.toml",
                        provider_batch_gather_s=0, _env_file=None)
    return session_factory(url), settings, CollectingDispatcher()


def _job(env: Any, lines: int, queue: str = "bulk") -> str:
    sessions, settings, dispatcher = env
    return pipeline.create_job_in_process(sessions, io.BytesIO(jsonl([
        {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]}}
        for i in range(lines)])), settings=settings, deployments=settings.load_deployments(),
        dispatcher=dispatcher, queue=queue).id


def _run(env: Any, job_id: str) -> None:
    sessions, settings, _ = env
    executor = BatchExecutor(sessions, settings.load_deployments(), LocalLimiter(), settings)
    executor.run(BatchRef(job_id, 1, 1000))


def _loop(env: Any, fake: FakeBatches) -> ProviderBatchLoop:
    sessions, settings, dispatcher = env
    loop = ProviderBatchLoop(sessions, settings.load_deployments(), settings, dispatcher)
    loop._clients["ob"] = fake  # type: ignore[assignment]
    return loop


def _due_now(sessions: sessionmaker[Session]) -> None:
    with sessions.begin() as session:
        session.execute(update(ProviderBatch).values(next_poll_at=utcnow()))


def test_bulk_lines_are_queued_cut_within_limits_and_stored_once(env: Any) -> None:
    sessions = env[0]
    job_id = _job(env, 7)
    _run(env, job_id)
    with sessions() as session:
        owners = set(session.scalars(select(Item.lease_owner).where(Item.job_id == job_id)))
        assert owners == {OWNER}
        assert session.scalar(select(func.count()).select_from(ProviderBatchLine)) == 7
    fake = FakeBatches()
    loop = _loop(env, fake)
    loop.round()  # gather (3 + 3 + 1 lines: batch_max_lines = 3) and upload
    assert sorted(len(lines) for lines in fake.submitted.values()) == [1, 3, 3]
    _due_now(sessions)
    loop.round()  # poll: ended; collect
    with sessions() as session:
        assert session.scalar(select(Job.status).where(Job.id == job_id)) == "completed"
        assert set(session.scalars(select(Result.deployment))) == {"ob"}
        spend = session.scalars(select(Spend)).one()
    assert (spend.requests, spend.prompt_tokens, spend.completion_tokens) == (7, 70, 28)
    assert spend.cost == pytest.approx((70 * 0.5 + 28 * 1.0) / 1e6)
    # Results downloaded again (a worker died before it marked the batch done): the
    # answers are stored and billed once.
    with sessions.begin() as session:
        session.execute(update(ProviderBatch).values(state="collecting", next_poll_at=utcnow()))
    loop.round()
    assert fake.downloads == 6
    with sessions() as session:
        assert session.scalar(select(func.count()).select_from(Result)) == 7
        assert session.scalars(select(Spend)).one().requests == 7


def test_an_upload_whose_id_was_not_stored_is_found_again(env: Any) -> None:
    sessions = env[0]
    job_id = _job(env, 2)
    _run(env, job_id)
    fake = FakeBatches()
    loop = _loop(env, fake)
    loop.round()
    assert len(fake.submitted) == 1
    with sessions.begin() as session:  # the crash: uploaded, but the id never stored
        session.execute(update(ProviderBatch).values(state="uploading", provider_id=None,
                                                     next_poll_at=utcnow()))
    loop.round()
    assert len(fake.submitted) == 1
    with sessions() as session:
        assert session.scalars(select(ProviderBatch.provider_id)).one() == "pb0"


def test_other_queues_skip_batch_deployments(env: Any) -> None:
    job_id = _job(env, 3, queue="standard")
    _run(env, job_id)
    with env[0]() as session:
        assert set(session.scalars(select(Result.deployment))) == {"rt"}
        assert session.scalar(select(func.count()).select_from(ProviderBatchLine)) == 0


def test_a_closing_window_moves_unsent_lines_to_realtime(env: Any) -> None:
    sessions, _settings, dispatcher = env
    job_id = _job(env, 4)
    _run(env, job_id)
    with sessions.begin() as session:  # 30 minutes left, under the default 1 h margin
        session.execute(update(Job).values(expires_at=utcnow() + timedelta(minutes=30)))
    fake = FakeBatches()
    _loop(env, fake).round()
    assert fake.submitted == {}
    # Two provider batches' worth (batch_max_lines = 3), each queued again as it was.
    assert [(ref.first_line, ref.last_line) for ref in dispatcher.batches][-2:] == [
        (1, 3), (4, 4)]
    _run(env, job_id)  # the lines come back: to the realtime deployment, not a batch
    with sessions() as session:
        assert set(session.scalars(select(Result.deployment))) == {"rt"}
        assert session.scalar(select(Job.status).where(Job.id == job_id)) == "completed"


def test_provider_result_lines_read_as_direct_answers() -> None:
    ok = read_line({"custom_id": "q3", "response": {"status_code": 200, "request_id": "r",
                    "body": {"usage": {"prompt_tokens": 5, "completion_tokens": 2}}}},
                   "openai-batch")
    assert ok is not None and ok.kind == "succeeded" and ok.line_no == 3
    assert (ok.outcome.prompt_tokens, ok.outcome.completion_tokens) == (5, 2)  # type: ignore[union-attr]
    expired = read_line({"custom_id": "q4", "response": None,
                         "error": {"code": "batch_expired", "message": "x"}}, "openai-batch")
    assert expired is not None and (expired.kind, expired.retryable) == ("expired", True)
    bad = read_line({"custom_id": "q5", "response": {"status_code": 400, "body": {
        "error": {"message": "no"}}}}, "openai-batch")
    assert bad is not None and (bad.kind, bad.retryable) == ("errored", False)
    overloaded = read_line({"custom_id": "q6", "result": {"type": "errored", "error": {
        "type": "error", "error": {"type": "overloaded_error", "message": "busy"}}}},
        "anthropic-batch")
    assert overloaded is not None and overloaded.retryable
    assert read_line({"custom_id": "someone-else"}, "openai-batch") is None


def test_batch_deployments_need_a_base_url_and_have_the_providers_limits(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs base_url"):
        Deployment(name="x", provider="anthropic-batch", model="m")
    anthropic = Deployment(name="a", provider="anthropic-batch", model="m",
                           base_url="http://h")
    assert anthropic.batch_limits == (100_000, 256 * 1024 * 1024, None)
    (tmp_path / "d.toml").write_text(TOML)
    deployments = load_deployments(tmp_path / "d.toml")
    route = deployments.routes["m"]
    assert route.batch_deployment(deployments).name == "ob"  # type: ignore[union-attr]
    realtime = route.realtime(deployments)
    assert realtime is not None and (realtime.deployments, realtime.fallback) == (["rt"], [])


class SlowBatches(FakeBatches):
    """A provider whose batches run until cancelled; then they end with no results."""

    def retrieve(self, provider_id: str) -> Remote:
        if provider_id in self.cancelled:
            return Remote(provider_id, "cancelled", True, "cancelled", None, None)
        return Remote(provider_id, "in_progress", False)

    def results(self, remote: Remote) -> Any:
        return iter(())


def test_a_window_closing_on_a_running_batch_cancels_it_and_goes_realtime(env: Any) -> None:
    sessions = env[0]
    job_id = _job(env, 2)
    _run(env, job_id)
    fake = SlowBatches()
    loop = _loop(env, fake)
    loop.round()
    _due_now(sessions)
    loop.round()
    assert fake.cancelled == []  # a day left: the batch runs on
    with sessions.begin() as session:
        session.execute(update(Job).values(expires_at=utcnow() + timedelta(minutes=30)))
    _due_now(sessions)
    loop.round()
    assert fake.cancelled == ["pb0"]
    with sessions() as session:
        assert session.scalars(select(ProviderBatch.cancel_reason)).one() == "window"
    _run(env, job_id)
    with sessions() as session:
        assert set(session.scalars(select(Result.deployment))) == {"rt"}
        assert session.scalar(select(Job.status).where(Job.id == job_id)) == "completed"


def test_retried_failures_go_to_a_provider_batch_again(env: Any) -> None:
    sessions, settings, dispatcher = env
    job_id = _job(env, 2)
    _run(env, job_id)
    fake = FakeBatches()
    loop = _loop(env, fake)
    loop.round()
    _due_now(sessions)
    loop.round()
    with sessions.begin() as session:  # as if the provider had failed both lines
        session.execute(update(Result).values(error={"code": "provider_error"}))
        session.execute(update(Item).values(status="failed"))
    assert jobs.retry_failed(sessions, job_id, dispatcher, settings) == 2
    _run(env, job_id)
    with sessions() as session:
        owners = set(session.scalars(select(Item.lease_owner).where(Item.job_id == job_id)))
    assert owners == {OWNER}
    loop.round()
    assert len(fake.submitted) == 2


def test_a_tenant_over_its_spend_limit_stops_its_provider_batches(env: Any) -> None:
    sessions = env[0]
    job_id = _job(env, 2)
    _run(env, job_id)
    fake = SlowBatches()
    loop = _loop(env, fake)
    loop.round()
    with sessions.begin() as session:  # what execution/stopping.py does at the limit
        session.execute(update(Job).values(stop_reason="spend_limit_exceeded"))
    _due_now(sessions)
    loop.round()
    assert fake.cancelled == ["pb0"]
    with sessions() as session:
        statuses = set(session.scalars(select(Item.status).where(Item.job_id == job_id)))
    assert statuses == {"spend_limited"}

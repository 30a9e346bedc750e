"""The monthly spend limit, on the real PostgreSQL and a real mock provider (prices and
costs alone: tests/unit/tenants/test_spend.py).

The proof of the limit: two jobs that each fit what the tenant has left are submitted
together and run at once; between them they would spend nearly twice the limit, and the
limit stops them both within a second of being reached, with every unsent line listed
as `spend_limit_exceeded` and the ledger equal to what the stored answers cost."""

import io
import json
import threading
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.budget.buckets import LocalLimiter
from quotaflow.config import Settings
from quotaflow.deployments.pricing import Prices
from quotaflow.dispatch.queues import CollectingDispatcher
from quotaflow.errors import SpendLimitExceeded
from quotaflow.execution import BatchExecutor
from quotaflow.ingest.pipeline import JobSpec, create_job
from quotaflow.jobs.view import job_object
from quotaflow.models import Item, ItemStatus, Job, JobStatus, Result, Spend
from quotaflow.observe.gauges import StateCollector
from quotaflow.providers.base import ProviderResponse
from quotaflow.providers.outcomes import Provenance
from quotaflow.results import output
from quotaflow.results.leases import ClaimedItem, store_many
from quotaflow.runtime import Runtime
from quotaflow.tenants import keys as auth
from quotaflow.tenants import spend
from tests.harness.api_app import app_client
from tests.harness.factories import chat_line, jsonl

# A cent a token either way, so a small job costs amounts that are easy to read.
PRICE = 10_000.0
LINES = 400
MAX_TOKENS = 8  # the mock's reply to "prompt of cNNN" is cut to 8 tokens: cost = estimate


def _deployments(tmp_path: Path, settings: Settings, provider: str) -> Settings:
    (tmp_path / "d.toml").write_text(
        f'[deployments.slow]\nprovider = "openai"\nbase_url = "{provider}/v1"\nmodel = "m"\n'
        f'rpm = 600000\ntpm = 100000000\nmax_concurrency = 4\ninput_per_mtok = {PRICE}\n'
        f'output_per_mtok = {PRICE}\n[routes]\n"*" = "slow"\n')
    return settings.model_copy(update={"deployments_file": tmp_path / "d.toml",
                                       "batch_size": LINES})


def _submit(sessions: sessionmaker[Session], settings: Settings, tenant: str, prefix: str,
            dispatcher: CollectingDispatcher) -> str:
    lines = [chat_line(f"{prefix}{i:03}", max_tokens=MAX_TOKENS) for i in range(LINES)]
    spec = JobSpec(queue="realtime", tenant=tenant)
    return create_job(sessions, io.BytesIO(jsonl(lines)), settings=settings,
                      deployments=settings.load_deployments(), dispatcher=dispatcher,
                      spec=spec).job.id


def _ledger_matches_results(sessions: sessionmaker[Session], tenant: str) -> float:
    """The month's spend, checked against the stored answers' usage at the prices."""
    with sessions() as session:
        spent = spend.month_spent(session, tenant)
        prompt, completion = session.execute(
            select(func.sum(Result.prompt_tokens), func.sum(Result.completion_tokens))
            .join(Job, Job.id == Result.job_id).where(Job.tenant == tenant)).one()
    assert spent == pytest.approx((prompt + completion) * PRICE / 1e6)
    return spent


def test_a_chunk_stored_twice_is_billed_once(pg_sessions: sessionmaker[Session]) -> None:
    # Given two answered calls, billed at a cent a token
    billing = spend.Billing("t-once", {"slow": Prices(PRICE, PRICE)})
    with pg_sessions.begin() as session:
        session.add(Job(id="batch_once", status=JobStatus.IN_PROGRESS, queue="bulk",
                        endpoint="/v1/chat/completions", total=2, tenant="t-once"))
        session.add_all(Item(job_id="batch_once", line_no=line, custom_id=f"c{line}", body={},
                             status=ItemStatus.RUNNING) for line in (1, 2))
    entries = [(ClaimedItem(line, f"c{line}", {}, 0),
                ProviderResponse(200, {"ok": True}, None, prompt_tokens=10,
                                 completion_tokens=5, cached_tokens=0))
               for line in (1, 2)]
    provenance = [Provenance("slow", 1, 0.0, 0.0, 0.0)] * 2
    # When the same chunk is stored twice (a batch run again after a crash)
    for _ in range(2):
        store_many(pg_sessions, "batch_once", entries, provenance=provenance,
                   on_stored=billing.stored)
    # Then the ledger holds it once: 2 calls, 30 tokens, 30 cents
    with pg_sessions() as session:
        row = session.execute(select(Spend)).scalar_one()
        assert (row.requests, row.prompt_tokens, row.completion_tokens) == (2, 20, 10)
        assert row.cost == pytest.approx(0.30) and row.currency == "USD"
        assert spend.month_spent(session, "t-once") == pytest.approx(0.30)


def test_a_batch_that_may_cost_more_than_is_left_is_refused_whole(
        pg_sessions: sessionmaker[Session], settings: Settings, tmp_path: Path) -> None:
    settings = _deployments(tmp_path, settings, "http://127.0.0.1:9")
    auth.create_key(pg_sessions, "t-small", max_monthly_spend=20.0)
    # 400 lines of 4 prompt and at most 8 completion tokens: up to 48.00 at a cent a token
    with pytest.raises(SpendLimitExceeded) as refused:
        _submit(pg_sessions, settings, "t-small", "c", CollectingDispatcher())
    message = str(refused.value)
    assert "may cost up to 48.00 USD (at least 16.00 USD)" in message
    assert "limit of 20.00 USD" in message and "20.00 USD is left" in message
    assert "--max-spend" in message
    with pg_sessions() as session:  # nothing of it was stored
        assert session.scalar(select(func.count()).select_from(Job)) == 0
        assert session.scalar(select(func.count()).select_from(Item)) == 0


def test_a_running_job_stops_sending_within_a_second_of_the_limit(
        pg_sessions: sessionmaker[Session], settings: Settings, tmp_path: Path,
        slow_provider: str) -> None:
    # Given a tenant allowed 50.00 a month and two jobs that may cost 48.00 each: both
    # fit when submitted (nothing is spent yet), together they would spend 96.00
    settings = _deployments(tmp_path, settings, slow_provider)
    auth.create_key(pg_sessions, "t-run", max_monthly_spend=50.0)
    dispatcher = CollectingDispatcher()
    job_ids = [_submit(pg_sessions, settings, "t-run", prefix, dispatcher)
               for prefix in ("a", "b")]
    # When both run at once (4 calls of 100 ms in flight each: 80 calls, 9.60, a second)
    reports = []
    threads = [threading.Thread(target=lambda ref=ref: reports.append(
        BatchExecutor(pg_sessions, settings.load_deployments(), LocalLimiter(),
                      settings).run(ref))) for ref in dispatcher.batches]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    # Then the month ends past the limit by less than a second of calls, and the ledger
    # is exactly what the stored answers cost
    spent = _ledger_matches_results(pg_sessions, "t-run")
    assert 50.0 <= spent < 50.0 + 9.6, spent
    # And every line is accounted for once: answered, or listed as not sent
    stats = httpx.get(f"{slow_provider}/stats").json()
    assert stats["admitted"] == sum(report.succeeded for report in reports)
    with pg_sessions() as session:
        for job_id in job_ids:
            job = session.get_one(Job, job_id)
            assert (job.status, job.stop_reason) == (JobStatus.COMPLETED, "spend_limit_exceeded")
            errors = [json.loads(line)["error"]
                      for line in output.iter_output(session, job_id, errors=True)]
            assert {e["code"] for e in errors} <= {"spend_limit_exceeded"}
            view = job_object(session, job)
            counts = view["request_counts"]
            assert counts["completed"] + len(errors) == LINES
            assert counts["completed"] + counts["failed"] == LINES
            # And the job reports what it cost, from the same ledger
            assert view["cost"]["total"] == pytest.approx(counts["completed"] * 12 * PRICE / 1e6)
            assert view["cost"]["currency"] == "USD" and view["cost"]["complete"]
    # And Prometheus is served the same sum (quotaflow_cost_total{deployment,tenant})
    families = {family.name: family for family in StateCollector(Runtime(settings))._statuses()}
    assert [(sample.name, sample.labels, sample.value)
            for sample in families["quotaflow_cost"].samples] == [
        ("quotaflow_cost_total", {"deployment": "slow", "tenant": "t-run"}, pytest.approx(spent))]
    assert sum(r.succeeded for r in reports) < 2 * LINES
    # And a third job is refused at once: nothing is left this month
    with pytest.raises(SpendLimitExceeded, match=r"is spent, 0\.00 USD is left"):
        _submit(pg_sessions, settings, "t-run", "c", dispatcher)


def test_the_api_refuses_it_with_a_400_naming_the_numbers(
        pg_sessions: sessionmaker[Session], settings: Settings, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _deployments(tmp_path, settings, "http://127.0.0.1:9").model_copy(
        update={"auth": True, "max_monthly_spend": 5.0})  # the default limit, no own one
    key = auth.create_key(pg_sessions, "t-api")
    lines = jsonl([chat_line(f"c{i:03}", max_tokens=MAX_TOKENS) for i in range(LINES)])
    for client in app_client(settings, monkeypatch):
        answer = client.post("/jobs", files={"file": ("in.jsonl", lines)},
                             headers={"Authorization": f"Bearer {key.secret}"})
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["code"] == "spend_limit_exceeded"
        assert "up to 48.00 USD" in error["message"] and "limit of 5.00 USD" in error["message"]
    with pg_sessions() as session:
        assert session.scalar(select(func.count()).select_from(Job)) == 0

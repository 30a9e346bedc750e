"""Cache writes billed at their price, on the real PostgreSQL and the strict Messages mock
(the arithmetic alone: tests/unit/deployments/test_prices.py).

Every line of these Anthropic-format jobs marks its long system prompt with
`cache_control`, so every call writes 100 tokens to the cache, which the mock reports as
Anthropic does (`cache_creation_input_tokens`). At 1.25 times the input price those
writes are most of a line's cost: billed as plain input, the ledger under-counts each
line by a fifth, the job's cost is wrong and the spend limit stops the jobs a fifth too
late. Here the ledger equals the answers' usage at the cache-write price, and the limit
stops two jobs running at once within a second of calls of where the real bill reaches
it.
"""

import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.budget.buckets import LocalLimiter
from quotaflow.config import Settings
from quotaflow.dispatch.queues import CollectingDispatcher
from quotaflow.errors import SpendLimitExceeded
from quotaflow.execution import BatchExecutor
from quotaflow.ingest.pipeline import JobSpec, create_job
from quotaflow.jobs.view import job_object
from quotaflow.models import Job, JobStatus
from quotaflow.results import output
from quotaflow.tenants import keys as auth
from quotaflow.tenants import spend
from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import service_env

KEY_ENV = "QF_TEST_CACHE_PRICES_KEY"
CENT = 10_000.0  # per million tokens: a cent a token
WRITE = 1.25 * CENT  # Anthropic's 5-minute cache writes
READ = 0.1 * CENT
LIMIT = 100.0
LINES = 70  # a job may cost up to 70 x 1.405 = 98.35: each fits the limit alone
CALLS_A_SECOND = 8  # 2 jobs x 2 calls in flight x 2 calls of 500 ms a second


@pytest.fixture
def messages_mock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The strict Messages API mock answering in 500 ms, with limits that never bind."""
    monkeypatch.setenv(KEY_ENV, "sk-ant-test")
    port = free_port()
    proc = Proc("messages-mock", quotaflow(
        "mock-provider", "--port", str(port), "--rpm", "600000", "--tpm", "1", "--itpm",
        "100000000", "--otpm", "100000000", "--latency-ms", "500", "--api-key-env", KEY_ENV),
        service_env(**{KEY_ENV: "sk-ant-test"}), tmp_path)
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/healthz")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop()


def _settings(tmp_path: Path, settings: Settings, base_url: str) -> Settings:
    (tmp_path / "d.toml").write_text(
        f'[deployments.claude]\nprovider = "anthropic"\nbase_url = "{base_url}"\n'
        f'model = "claude-test"\napi_key_env = "{KEY_ENV}"\nrpm = 600000\n'
        'itpm = 100000000\notpm = 100000000\nmax_concurrency = 2\n'
        f'input_per_mtok = {CENT}\noutput_per_mtok = {CENT}\n'
        f'cached_input_per_mtok = {READ}\ncache_write_per_mtok = {WRITE}\n'
        '[routes]\n"*" = "claude"\n')
    return settings.model_copy(update={"deployments_file": tmp_path / "d.toml",
                                       "batch_size": LINES})


def _line(custom_id: str) -> dict[str, Any]:
    """100 system tokens marked for caching (the id first: no two lines share a prefix),
    a 6-token question, and a reply the mock cuts at 8 tokens."""
    system = (custom_id + " ").ljust(400, "x")
    return {"custom_id": custom_id, "params": {
        "model": "claude-test", "max_tokens": 8,
        "system": [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": f"question {custom_id} please"}]}}


def _submit(sessions: sessionmaker[Session], settings: Settings, tenant: str, prefix: str,
            dispatcher: CollectingDispatcher, lines: int = LINES) -> str:
    data = "".join(json.dumps(_line(f"{prefix}{i:03}")) + "\n" for i in range(lines))
    return create_job(sessions, io.BytesIO(data.encode()), settings=settings,
                      deployments=settings.load_deployments(), dispatcher=dispatcher,
                      spec=JobSpec(queue="realtime", tenant=tenant)).job.id


def _billed(sessions: sessionmaker[Session], job_ids: list[str]) -> tuple[float, int, int]:
    """(what the answers cost at their own prices, their cache writes, reads), from the
    usage of each stored Message as the mock reported it."""
    cost, writes, reads = 0.0, 0, 0
    with sessions() as session:
        for job_id in job_ids:
            for line in output.iter_output(session, job_id, errors=False):
                usage = json.loads(line)["result"]["message"]["usage"]
                writes += usage["cache_creation_input_tokens"]
                reads += usage["cache_read_input_tokens"]
                cost += (usage["input_tokens"] * CENT + usage["output_tokens"] * CENT
                         + usage["cache_creation_input_tokens"] * WRITE
                         + usage["cache_read_input_tokens"] * READ) / 1e6
    return cost, writes, reads


def _run(sessions: sessionmaker[Session], settings: Settings,
         dispatcher: CollectingDispatcher) -> None:
    threads = [threading.Thread(target=lambda ref=ref: BatchExecutor(
        sessions, settings.load_deployments(), LocalLimiter(), settings).run(ref))
        for ref in dispatcher.batches]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)


def test_cache_writes_are_charged_at_their_price_and_the_limit_stops_on_the_bill(
        pg_sessions: sessionmaker[Session], settings: Settings, tmp_path: Path,
        messages_mock: str) -> None:
    # Given a tenant allowed 100.00 and two jobs that may cost 98.35 each: both fit when
    # submitted, together their answers would cost 194.60 (1.39 a line)
    settings = _settings(tmp_path, settings, messages_mock)
    auth.create_key(pg_sessions, "t-cache", max_monthly_spend=LIMIT)
    dispatcher = CollectingDispatcher()
    job_ids = [_submit(pg_sessions, settings, "t-cache", prefix, dispatcher)
               for prefix in ("a", "b")]
    # When both run at once
    _run(pg_sessions, settings, dispatcher)
    # Then every answer wrote its 100-token prefix, billed at the cache-write price: the
    # ledger is what the answers' usage costs at their own prices, not at the input's
    billed, writes, reads = _billed(pg_sessions, job_ids)
    answered = writes // 100
    assert writes == 100 * answered and reads == 0 and answered > 0
    stats = httpx.get(f"{messages_mock}/stats").json()
    assert stats["cache_write_tokens"] == writes
    with pg_sessions() as session:
        spent = spend.month_spent(session, "t-cache")
    assert spent == pytest.approx(billed) and billed == pytest.approx(answered * 1.39)
    # And the limit stopped both jobs within a second of calls of where the bill reached
    # it (billed as input, the ledger reaches 100.00 only after 88 answers: 122.32)
    assert LIMIT <= spent < LIMIT + CALLS_A_SECOND * 1.39, spent
    with pg_sessions() as session:
        for job_id in job_ids:
            job = session.get_one(Job, job_id)
            assert (job.status, job.stop_reason) == (JobStatus.COMPLETED, "spend_limit_exceeded")
        costs = [job_object(session, session.get_one(Job, job_id))["cost"]["total"]
                 for job_id in job_ids]
    # And the jobs report the same cost, from the same ledger
    assert sum(costs) == pytest.approx(billed)


def test_a_job_whose_cache_writes_would_pass_the_limit_is_refused(
        pg_sessions: sessionmaker[Session], settings: Settings, tmp_path: Path) -> None:
    # 72 lines may cost 72 x (106 prompt tokens at the write price + 8 at the output's) =
    # 101.16 (82.08 were the writes billed as input)
    settings = _settings(tmp_path, settings, "http://127.0.0.1:9")
    auth.create_key(pg_sessions, "t-cache-small", max_monthly_spend=LIMIT)
    with pytest.raises(SpendLimitExceeded, match=r"may cost up to 101\.16 USD"):
        _submit(pg_sessions, settings, "t-cache-small", "c", CollectingDispatcher(), lines=72)

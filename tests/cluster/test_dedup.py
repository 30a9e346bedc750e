"""Identical requests within a job are sent once and share the answer where it cannot
differ (or as the job asks); per-job retry limits."""

import functools
import io
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from quotaflow.budget.buckets import LocalLimiter
from quotaflow.config import Settings
from quotaflow.dispatch.queues import CollectingDispatcher
from quotaflow.execution import BatchExecutor
from quotaflow.ingest import pipeline
from quotaflow.jobs import service as jobs
from quotaflow.jobs import view as job_view
from quotaflow.models import Item
from quotaflow.results import output
from tests.harness import factories
from tests.harness.cluster import deployment_file, start_provider
from tests.harness.factories import jsonl

# Lines whose answer cannot differ (temperature 0): identical ones share one call.
chat_line = functools.partial(factories.chat_line, temperature=0)


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[str]:
    proc, url = start_provider(tmp_path, "--rpm", "60000", "--tpm", "10000000")
    try:
        yield url
    finally:
        proc.stop()


@pytest.fixture
def failing(settings: Settings, tmp_path: Path) -> Iterator[str]:
    """A provider answering 500 to everything (until told otherwise), as the deployment;
    its circuit never opens here, so every try reaches it."""
    proc, url = start_provider(tmp_path, "--rpm", "60000", "--tpm", "10000000",
                               "--fault", "500=1")
    settings.deployments_file = deployment_file(tmp_path, "broken", url,
                                                "circuit_failures = 100\n")
    try:
        yield url
    finally:
        proc.stop()


def submit(sessions, settings: Settings, lines: list[dict], max_attempts: int | None = None,
           tenant: str = "default", dedup: bool | None = None
           ) -> tuple[str, CollectingDispatcher]:
    dispatcher = CollectingDispatcher()
    job = pipeline.create_job_in_process(
        sessions, io.BytesIO(jsonl(lines)), settings=settings,
        deployments=settings.load_deployments(), dispatcher=dispatcher, queue="realtime",
        max_attempts=max_attempts, tenant=tenant, dedup=dedup)
    return job.id, dispatcher


def run_all(sessions, settings: Settings, dispatcher: CollectingDispatcher) -> None:
    executor = BatchExecutor(sessions, settings.load_deployments(), LocalLimiter(), settings,
                             defer=False)
    for ref in dispatcher.batches:
        executor.run(ref)


def outputs(sessions, job_id: str, errors: bool = False) -> dict[str, dict]:
    with sessions() as session:
        return {line["custom_id"]: line for line in map(
            json.loads, output.iter_output(session, job_id, errors=errors))}


def test_identical_requests_are_sent_once_and_share_the_answer(
        pg_sessions, settings, tmp_path, provider: str) -> None:
    # Given six lines, of which three ask the same thing and two another same thing
    settings.deployments_file = deployment_file(tmp_path, "p", provider)
    lines = [chat_line("a1", "same"), chat_line("b1", "other"), chat_line("a2", "same"),
             chat_line("u", "unique"), chat_line("b2", "other"), chat_line("a3", "same")]
    job_id, dispatcher = submit(pg_sessions, settings, lines)
    # When the job runs
    run_all(pg_sessions, settings, dispatcher)
    # Then the provider was called three times, once per distinct request
    stats = httpx.get(f"{provider}/stats").json()
    assert (stats["admitted"], stats["max_calls_per_body"]) == (3, 1)
    # And every line has its answer; the copies say whose call they share
    out = outputs(pg_sessions, job_id)
    assert set(out) == {"a1", "b1", "a2", "u", "b2", "a3"}
    for copy, original in (("a2", "a1"), ("a3", "a1"), ("b2", "b1")):
        assert out[copy]["shared_from"] == {"id": out[original]["id"], "custom_id": original,
                                            "batch_id": job_id}
        assert out[copy]["response"]["body"] == out[original]["response"]["body"]
        assert out[copy]["id"] != out[original]["id"]
    assert all("shared_from" not in out[cid] for cid in ("a1", "b1", "u"))
    # And the job's usage counts each call once, and every line as completed
    with pg_sessions() as session:
        view = job_view.job_object(session, jobs.get_job(session, job_id))
    assert view["status"] == "completed"
    assert view["request_counts"]["completed"] == 6
    assert view["usage"]["input_tokens"] == stats["prompt_tokens"]


def test_without_dedup_every_line_is_sent(pg_sessions, settings, tmp_path, provider) -> None:
    # QUOTAFLOW_DEDUP=false: even lines whose answer cannot differ are each sent
    settings.deployments_file = deployment_file(tmp_path, "p", provider)
    settings.dedup = False  # e.g. sampling one prompt several times at temperature 1
    job_id, dispatcher = submit(pg_sessions, settings,
                                [chat_line(f"s{i}", "same") for i in range(4)])
    run_all(pg_sessions, settings, dispatcher)
    assert httpx.get(f"{provider}/stats").json()["admitted"] == 4
    assert all("shared_from" not in line for line in outputs(pg_sessions, job_id).values())


def sampled(custom_id: str, **body: object) -> dict:
    """One prompt asked as a sampling line (the provider's default temperature unless
    `body` says otherwise): a common way to draw several samples."""
    line = factories.chat_line(custom_id, "write a haiku about rain")
    line["body"].update(body)
    return line


@pytest.mark.parametrize(("sampling", "dedup", "calls"), [
    ({}, None, 5),  # no temperature: the provider's default of 1 samples
    ({"temperature": 1}, None, 5),
    ({"temperature": 0.7}, None, 5),
    ({"temperature": 0, "n": 3}, None, 5),
    ({"temperature": 0, "top_p": 0.5}, None, 5),
    ({"temperature": 0}, None, 1),  # the answer cannot differ: one call
    ({"temperature": 0, "n": 1, "top_p": 1}, None, 1),
    ({"temperature": 1}, True, 1),  # the job asks to share
    ({"temperature": 0}, False, 5),  # the job asks for every line to be sent
])
def test_identical_lines_are_shared_only_where_the_answer_cannot_differ(
        pg_sessions, settings, tmp_path, provider: str, sampling: dict, dedup: bool | None,
        calls: int) -> None:
    # Given five identical lines, sampled or not, in a job that may ask its own way
    settings.deployments_file = deployment_file(tmp_path, "p", provider)
    job_id, dispatcher = submit(pg_sessions, settings,
                                [sampled(f"s{i}", **sampling) for i in range(5)],
                                dedup=dedup)
    run_all(pg_sessions, settings, dispatcher)
    # Then the provider saw one call per sample drawn, and only copies say they share
    assert httpx.get(f"{provider}/stats").json()["admitted"] == calls
    out = outputs(pg_sessions, job_id)
    assert len(out) == 5
    assert sum("shared_from" in line for line in out.values()) == 5 - calls


def test_identical_embeddings_and_anthropic_lines_at_temperature_zero_are_shared(
        pg_sessions, settings, tmp_path, provider: str) -> None:
    settings.deployments_file = deployment_file(tmp_path, "p", provider)
    embed = {"method": "POST", "url": "/v1/embeddings",
             "body": {"model": "gpt-4o-mini", "input": "the same text"}}
    job_id, dispatcher = submit(pg_sessions, settings,
                                [{"custom_id": f"e{i}", **embed} for i in range(3)])
    run_all(pg_sessions, settings, dispatcher)
    assert httpx.get(f"{provider}/stats").json()["admitted"] == 1
    params = {"model": "gpt-4o-mini", "max_tokens": 16,
              "messages": [{"role": "user", "content": "the same question"}]}
    lines = [{"custom_id": "t0-a", "params": {**params, "temperature": 0}},
             {"custom_id": "t0-b", "params": {**params, "temperature": 0}},
             {"custom_id": "t1-a", "params": params}, {"custom_id": "t1-b", "params": params}]
    job_id, dispatcher = submit(pg_sessions, settings, lines)
    run_all(pg_sessions, settings, dispatcher)
    assert httpx.get(f"{provider}/stats").json()["admitted"] == 1 + 3
    # (Anthropic's result lines have no shared_from: a shared answer is the same Message)
    ids = {cid: line["result"]["message"]["id"]
           for cid, line in outputs(pg_sessions, job_id).items()}
    assert ids["t0-a"] == ids["t0-b"] and ids["t1-a"] != ids["t1-b"]


def test_waiting_copies_are_cancelled_with_the_job(pg_sessions, settings) -> None:
    job_id, _ = submit(pg_sessions, settings, [chat_line("x1", "same"),
                                               chat_line("x2", "same")])
    with pg_sessions() as session:
        statuses = dict(session.execute(select(Item.custom_id, Item.status)
                                        .where(Item.job_id == job_id)).all())
    assert statuses == {"x1": "pending", "x2": "waiting"}
    jobs.cancel_job(pg_sessions, job_id)
    errors = outputs(pg_sessions, job_id, errors=True)
    assert {cid: line["error"]["code"] for cid, line in errors.items()} == {
        "x1": "batch_cancelled", "x2": "batch_cancelled"}
    with pg_sessions() as session:
        assert jobs.get_job(session, job_id).status == "cancelled"


def test_a_job_sets_its_own_retry_limit_and_errors_say_what_happened(
        pg_sessions, settings, failing: str) -> None:
    # Given a provider that fails every request with a 500, and a job allowing 2 tries
    settings.provider_max_attempts = 5
    job_id, dispatcher = submit(pg_sessions, settings,
                                [chat_line("e1", "one"), chat_line("e2", "two"),
                                 chat_line("e3", "one")], max_attempts=2)
    run_all(pg_sessions, settings, dispatcher)
    stats = httpx.get(f"{failing}/stats").json()
    # Then each distinct request was tried exactly twice, and each error line says what
    # happened, how many attempts were made, and the provider's last message
    assert stats["requests_total"] == 4
    errors = outputs(pg_sessions, job_id, errors=True)
    assert set(errors) == {"e1", "e2", "e3"}
    for line in errors.values():
        error = line["error"]
        assert error["code"] == "provider_error"
        assert error["attempts"] == 2
        assert "HTTP 500" in error["message"]
        assert "The server had an error (simulated)" in error["message"]
        assert "gave up after 2 attempts" in error["message"]
    assert errors["e3"]["shared_from"]["custom_id"] == "e1"
    with pg_sessions() as session:
        assert job_view.job_object(session, jobs.get_job(session, job_id))["max_attempts"] == 2


def test_retrying_a_failed_job_resends_originals_and_refills_their_copies(
        pg_sessions, settings, failing: str) -> None:
    job_id, dispatcher = submit(pg_sessions, settings,
                                [chat_line("r1", "same"), chat_line("r2", "same")],
                                max_attempts=1)
    run_all(pg_sessions, settings, dispatcher)
    assert set(outputs(pg_sessions, job_id, errors=True)) == {"r1", "r2"}
    # When the provider recovers and the failed requests are retried
    httpx.put(f"{failing}/faults", json={"500": 0}).raise_for_status()
    again = CollectingDispatcher()
    assert jobs.retry_failed(pg_sessions, job_id, again, settings) == 2
    assert [(b.first_line, b.last_line) for b in again.batches] == [(1, 1)]
    run_all(pg_sessions, settings, again)
    stats = httpx.get(f"{failing}/stats").json()
    # Then the one distinct request was sent once more, and both lines now succeed
    assert (stats["requests_total"], stats["admitted"]) == (2, 1)  # a 500, then one success
    out = outputs(pg_sessions, job_id)
    assert set(out) == {"r1", "r2"}
    assert out["r2"]["shared_from"]["custom_id"] == "r1"


@pytest.mark.parametrize("across_jobs", [True, False])
def test_a_later_job_may_reuse_an_earlier_jobs_answers(
        pg_sessions, settings, tmp_path, provider: str, across_jobs: bool) -> None:
    settings.deployments_file = deployment_file(tmp_path, "p", provider)
    settings.dedup_across_jobs = across_jobs
    first_id, first = submit(pg_sessions, settings, [chat_line("q1", "asked before")])
    run_all(pg_sessions, settings, first)
    # When a second job asks the same thing again, and something new
    second_id, second = submit(pg_sessions, settings, [chat_line("again", "asked before"),
                                                       chat_line("new", "never asked")])
    run_all(pg_sessions, settings, second)
    stats = httpx.get(f"{provider}/stats").json()
    out = outputs(pg_sessions, second_id)
    earlier = outputs(pg_sessions, first_id)["q1"]
    if across_jobs:
        # Then only the new request was sent; the repeated one carries the earlier answer
        assert stats["admitted"] == 2
        assert out["again"]["shared_from"] == {"id": earlier["id"], "custom_id": "q1",
                                               "batch_id": first_id}
        assert out["again"]["response"]["body"] == earlier["response"]["body"]
        with pg_sessions() as session:
            usage = job_view.job_object(session, jobs.get_job(session, second_id))["usage"]
        assert usage["input_tokens"] == out["new"]["response"]["body"]["usage"]["prompt_tokens"]
    else:
        # Then (the default) every job calls for itself
        assert stats["admitted"] == 3
        assert "shared_from" not in out["again"]


def test_answers_are_never_reused_across_tenants(pg_sessions, settings, tmp_path,
                                                 provider: str) -> None:
    settings.deployments_file = deployment_file(tmp_path, "p", provider)
    settings.dedup_across_jobs = True
    _, first = submit(pg_sessions, settings, [chat_line("mine", "a secret prompt")],
                      tenant="acme")
    run_all(pg_sessions, settings, first)
    other_id, other = submit(pg_sessions, settings, [chat_line("theirs", "a secret prompt")],
                             tenant="globex")
    run_all(pg_sessions, settings, other)
    assert httpx.get(f"{provider}/stats").json()["admitted"] == 2
    assert "shared_from" not in outputs(pg_sessions, other_id)["theirs"]

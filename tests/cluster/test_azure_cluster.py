"""Azure OpenAI deployments against the strict mock's Azure face (mock_provider/azure.py).

The conformance set's chat lines (OpenAI's, and Anthropic's translated to chat) go
through an azure deployment on the deployment-name path with an api-key, the
deployment's own headers and query (one read from the environment): the mock checks the
URL shape, api-version and key, records what it got, and the bodies are compared field
by field; a line with no chat equivalent fails naming its field and is never sent;
every answer comes back in the job's output shape; the workers' JSON log lines carry
the provider's request id and never a secret. Four workers on Azure's v1 path
authenticate with Entra ID (azure-identity's DefaultAzureCredential, fetching tokens
from the mock's managed identity endpoint) under the mock's limits: no 429, an OpenAI
job's answers chat.completions and an Anthropic job's Messages. And the provider itself
reads Azure's 429 (retry-after-ms, its message, its request id).
"""

import asyncio
import io
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.config import Settings
from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import RetryableProviderError
from quotaflow.ingest import pipeline
from quotaflow.jobs import service as jobs
from quotaflow.jobs.view import job_object
from quotaflow.providers.azure import AzureProvider
from quotaflow.results.output import iter_output
from tests.cluster.test_conformance_cluster import check_answer, check_refused, run
from tests.harness import conformance
from tests.harness.cluster import start_provider, start_workers, wait_until_finished
from tests.harness.conformance import comparable, field_diff
from tests.harness.factories import chat_line, jsonl
from tests.harness.procs import Proc, quotaflow
from tests.harness.servers import REDIS_URL, service_env
from workers.dispatch import CeleryDispatcher

KEY_ENV, TENANT_ENV = "QF_TEST_AZURE_KEY", "QF_TEST_AZURE_TENANT"
KEY, TENANT = "azure-key-0123456789abcdef", "tenant-secret-4711"
API_VERSION = "2024-10-21"
CHAT_FILES = ("chat_openai", "messages_anthropic")

pytestmark = pytest.mark.timeout(300)


def test_conformance_chat_lines_through_an_azure_deployment(
        pg_url: str, pg_sessions: sessionmaker[Session], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.setenv(TENANT_ENV, TENANT)
    record = tmp_path / "received.jsonl"
    procs: list[Proc] = []
    try:
        provider, url = start_provider(tmp_path, "--rpm", "600000", "--tpm", "100000000",
                                       "--latency-ms", "5", "--api-key-env", KEY_ENV,
                                       "--record", str(record))
        procs.append(provider)
        path = tmp_path / "deployments.toml"
        path.write_text(
            f'[deployments.az]\nprovider = "azure"\nbase_url = "{url}"\n'
            f'model = "gpt-4o-east"\napi_version = "{API_VERSION}"\n'
            f'api_key_env = "{KEY_ENV}"\nrpm = 600000\ntpm = 100000000\n'
            f'headers = {{ "X-Gateway-Tenant" = {{ env = "{TENANT_ENV}" }}, '
            '"OpenAI-Project" = "proj_batch" }\n'
            'query = { "route" = "east" }\n[routes]\n"*" = "az"\n')
        env = service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                          QUOTAFLOW_DEPLOYMENTS_FILE=str(path), QUOTAFLOW_LOG_FORMAT="json",
                          **{KEY_ENV: KEY, TENANT_ENV: TENANT})
        worker = Proc("worker1", quotaflow("worker", "--concurrency", "2", "--loglevel", "debug",
                                           "--name", "azure1@qftest"), env, tmp_path)
        procs.append(worker)
        worker.wait_until(lambda: " ready." in worker.log())
        settings = Settings(database_url=pg_url, broker_url=REDIS_URL, batch_size=10,
                            deployments_file=path, _env_file=None)
        problems: list[str] = []
        sent = 0
        for name in CHAT_FILES:
            record.unlink(missing_ok=True)
            entries = conformance.lines(name)
            output = run(pg_sessions, settings,
                         [{**e["line"], "custom_id": e["name"]} for e in entries])
            received = ([json.loads(line) for line in record.read_text().splitlines()]
                        if record.exists() else [])
            answered = check_output(entries, output)
            sent += len(answered)
            problems += check_received(answered, received)
        assert problems == [], "\n".join(problems)
        logged = worker.log(chars=10_000_000)
    finally:
        for proc in reversed(procs):
            proc.stop()
    answers = [json.loads(line) for line in logged.splitlines()
               if line.startswith("{") and "answered by az" in line]
    assert len(answers) == sent and all(a["provider_request_id"] for a in answers)
    assert KEY not in logged and TENANT not in logged


def check_output(entries: list[dict], output: dict[str, dict]) -> list[dict]:
    """Check each entry's output line; the entries that must have been sent. A refused
    line fails naming its field; an answer is in the job's shape: a chat.completion with
    Azure's content filter results as sent, or a Message for an Anthropic line."""
    assert sorted(output) == sorted(e["name"] for e in entries)
    answered = []
    for entry in entries:
        want, line = conformance.expected(entry, "openai"), output[entry["name"]]
        if "error" in want:
            check_refused(line, want["error"])
            continue
        check_answer(line, entry)
        if "params" not in entry["line"]:
            assert "prompt_filter_results" in line["response"]["body"], line
        answered.append(entry)
    return answered


def check_received(entries: list[dict], received: list[dict]) -> list[str]:
    """What the mock got that differs from the set's OpenAI bodies, or from Azure's wire."""
    problems = [] if len(received) == len(entries) else [
        f"the mock received {len(received)} requests, {len(entries)} expected"]
    for got in received:
        if got["path"] != "/openai/deployments/gpt-4o-east/chat/completions":
            problems.append(f"path {got['path']}")
        if got["query"] != f"api-version={API_VERSION}&route=east":
            problems.append(f"query {got['query']}")
        headers = got["headers"]
        if (headers.get("api-key"), headers.get("x-gateway-tenant"),
                headers.get("openai-project")) != ("<redacted>", TENANT, "proj_batch"):
            problems.append(f"headers {headers}")
        if "authorization" in headers:
            problems.append("an Authorization header went to Azure with the api-key")
    for entry in entries:
        want = comparable(conformance.expected(entry, "openai"))
        bodies = [r["body"] for r in received
                  if comparable(r["body"]).get("messages") == want.get("messages")]
        if len(bodies) != 1:
            problems.append(f"{entry['name']}: {len(bodies)} requests with its messages")
            continue
        got = dict(bodies[0])
        if got.pop("model", None) != "gpt-4o-east":
            problems.append(f"{entry['name']}: model not the Azure deployment's")
        problems += [f"{entry['name']}: {diff}" for diff in field_diff(want, got)]
    return problems


def test_four_workers_with_entra_id_on_the_v1_path_meet_no_429(
        pg_url: str, pg_sessions: sessionmaker[Session], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    count = 200
    procs: list[Proc] = []
    try:
        # Given a mock admitting 10 requests and 3,000 tokens a second, and a deployment
        # that knows it, without a key: the workers have a managed identity instead
        provider, url = start_provider(tmp_path, "--rpm", "600", "--tpm", "180000",
                                       "--burst-seconds", "1", "--latency-ms", "20",
                                       "--api-key-env", KEY_ENV)
        procs.append(provider)
        path = tmp_path / "deployments.toml"
        path.write_text(
            f'[deployments.az]\nprovider = "azure"\nbase_url = "{url}/openai/v1"\n'
            'model = "gpt-4o-v1"\nrpm = 600\ntpm = 180000\nburst_seconds = 1\n'
            '[routes]\n"*" = "az"\n')
        env = service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                          QUOTAFLOW_DEPLOYMENTS_FILE=str(path),
                          IDENTITY_ENDPOINT=f"{url}/msi/token", IDENTITY_HEADER=KEY)
        procs += start_workers(env, tmp_path, "entra", count=4)
        settings = Settings(database_url=pg_url, broker_url=REDIS_URL, batch_size=20,
                            deployments_file=path, _env_file=None)
        # And an OpenAI and an Anthropic job of half the lines each, run together
        httpx.post(f"{url}/stats/reset")
        started = time.monotonic()
        job_ids = {shape: pipeline.create_job_in_process(
            pg_sessions, io.BytesIO(jsonl(load_lines(shape, count // 2))), settings=settings,
            deployments=settings.load_deployments(), dispatcher=CeleryDispatcher(REDIS_URL),
            queue="realtime").id for shape in ("openai", "anthropic")}
        for job_id in job_ids.values():
            wait_until_finished(pg_sessions, job_id, started, 180, count // 2)
        took = time.monotonic() - started
        stats = httpx.get(f"{url}/stats").json()
        seen = httpx.get(f"{url}/azure/stats").json()
        with pg_sessions() as session:
            views = [job_object(session, jobs.get_job(session, job_id))
                     for job_id in job_ids.values()]
            out = {shape: [json.loads(line) for line in iter_output(session, job_id,
                                                                    errors=False)]
                   for shape, job_id in job_ids.items()}
    finally:
        for proc in reversed(procs):
            proc.stop()
    # Then every line has an answer, the budget held (no 429), and every call carried a
    # token the mock's identity endpoint issued
    for view in views:
        assert view["status"] == "completed", view
        assert view["request_counts"]["completed"] == count // 2, view
    assert (stats["admitted"], stats["rejected_429"], stats["duplicate_bodies"]) == (count, 0, 0)
    assert seen.get("entra") == count and "api-key" not in seen, seen
    assert not [k for k in seen if k.startswith("refused")], seen
    assert 1 <= seen["tokens-issued"] <= 16, seen
    assert took > count / 10 * 0.7  # the limit bound: 10 requests a second
    # And each job's answers are in its own shape: chat.completions, and Messages
    assert len(out["openai"]) == len(out["anthropic"]) == count // 2
    for line in out["openai"]:
        body = line["response"]["body"]
        assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"]
        assert line["response"]["request_id"]
    for line in out["anthropic"]:
        result = line["result"]
        assert result["type"] == "succeeded", line
        message = result["message"]
        assert message["type"] == "message" and message["role"] == "assistant", line
        assert message["content"][0]["type"] == "text", line
        assert message["content"][0]["text"].startswith("simulated reply to: question "), line
        assert message["stop_reason"] == "end_turn" and message["usage"]["output_tokens"], line


def load_lines(shape: str, count: int) -> list[dict[str, Any]]:
    """Chat lines of one shape: OpenAI's batch lines, or Anthropic's Message Batches."""
    if shape == "openai":
        return [chat_line(f"e{i}", f"question {i} about the tides", max_tokens=200)
                for i in range(count)]
    return [{"custom_id": f"m{i}", "params": {
        "model": "gpt-4o-v1", "max_tokens": 200,
        "messages": [{"role": "user", "content": f"question m{i} about the tides"}]}}
        for i in range(count)]


def test_the_provider_reads_azures_429(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    provider, url = start_provider(tmp_path, "--rpm", "60", "--tpm", "100000",
                                   "--burst-seconds", "1", "--latency-ms", "0",
                                   "--api-key-env", KEY_ENV)
    try:
        deployment = Deployment(name="az", provider="azure", model="gpt-4o-east", base_url=url,
                                api_version=API_VERSION, api_key_env=KEY_ENV, rpm=60,
                                tpm=100000)
        body = {"model": "gpt-4o-east", "max_tokens": 5,
                "messages": [{"role": "user", "content": "hello"}]}

        async def two_calls() -> tuple[object, BaseException]:
            azure = AzureProvider(deployment)
            try:
                first = await azure.send("/v1/chat/completions", body)  # the bucket's one
                with pytest.raises(RetryableProviderError) as refused:
                    await azure.send("/v1/chat/completions", body)
                return first, refused.value
            finally:
                await azure.aclose()

        first, error = asyncio.run(two_calls())
    finally:
        provider.stop()
    assert first.remaining_requests == 0 and first.request_id  # type: ignore[attr-defined]
    assert isinstance(error, RetryableProviderError) and error.status_code == 429
    assert error.retry_after is not None and 0 < error.retry_after <= 1.0  # retry-after-ms
    assert "Please retry after 1 second" in str(error) and error.request_id
    assert error.remaining == (0.0, error.remaining[1])

"""Azure OpenAI deployments against the strict mock's Azure face (mock_provider/azure.py).

The conformance set's chat lines go through an azure deployment on the deployment-name
path with an api-key, the deployment's own headers and query (one read from the
environment): the mock checks the URL shape, api-version and key, records what it got,
and the bodies are compared field by field; the workers' JSON log lines carry the
provider's request id and never a secret. Four workers on Azure's v1 path authenticate
with Entra ID (azure-identity's DefaultAzureCredential, fetching tokens from the mock's
managed identity endpoint) under the mock's limits: no 429, every answer a
chat.completion. And the provider itself reads Azure's 429 (retry-after-ms, its message,
its request id).
"""

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.config import Settings
from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import RetryableProviderError
from quotaflow.providers.azure import AzureProvider
from quotaflow.results.output import iter_output
from tests.harness import conformance
from tests.harness.cluster import start_provider, start_workers, submit_and_finish
from tests.harness.conformance import comparable, field_diff
from tests.harness.factories import chat_line
from tests.harness.procs import Proc, quotaflow
from tests.harness.servers import REDIS_URL, service_env

KEY_ENV, TENANT_ENV = "QF_TEST_AZURE_KEY", "QF_TEST_AZURE_TENANT"
KEY, TENANT = "azure-key-0123456789abcdef", "tenant-secret-4711"
API_VERSION = "2024-10-21"

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
        entries = conformance.lines("chat_openai")
        lines = [{**e["line"], "custom_id": e["name"]} for e in entries]
        view = submit_and_finish(pg_sessions, settings, lines, timeout=120)
        counts = view["request_counts"]
        assert (counts["completed"], counts["failed"]) == (len(lines), 0), view
        with pg_sessions() as session:
            out = [json.loads(line) for line in iter_output(session, view["id"], errors=False)]
        assert sorted(o["custom_id"] for o in out) == sorted(e["name"] for e in entries)
        for line in out:  # OpenAI's shape, Azure's content filter results kept as sent
            body = line["response"]["body"]
            assert body["object"] == "chat.completion" and "prompt_filter_results" in body
        received = [json.loads(line) for line in record.read_text().splitlines()]
        problems = check_received(entries, received)
        assert problems == [], "\n".join(problems)
        logged = worker.log(chars=10_000_000)
    finally:
        for proc in reversed(procs):
            proc.stop()
    answers = [json.loads(line) for line in logged.splitlines()
               if line.startswith("{") and "answered by az" in line]
    assert len(answers) == len(lines) and all(a["provider_request_id"] for a in answers)
    assert KEY not in logged and TENANT not in logged


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
        lines = [chat_line(f"e{i}", f"question {i} about the tides", max_tokens=200)
                 for i in range(count)]
        httpx.post(f"{url}/stats/reset")
        started = time.monotonic()
        view = submit_and_finish(pg_sessions, settings, lines, timeout=180)
        took = time.monotonic() - started
        stats = httpx.get(f"{url}/stats").json()
        seen = httpx.get(f"{url}/azure/stats").json()
    finally:
        for proc in reversed(procs):
            proc.stop()
    # Then every line has a chat.completion, the budget held (no 429), and every call
    # carried a token the mock's identity endpoint issued
    assert view["status"] == "completed" and view["request_counts"]["completed"] == count, view
    assert (stats["admitted"], stats["rejected_429"], stats["duplicate_bodies"]) == (count, 0, 0)
    assert seen.get("entra") == count and "api-key" not in seen, seen
    assert not [k for k in seen if k.startswith("refused")], seen
    assert 1 <= seen["tokens-issued"] <= 16, seen
    assert took > count / 10 * 0.7  # the limit bound: 10 requests a second
    with pg_sessions() as session:
        out = [json.loads(line) for line in iter_output(session, view["id"], errors=False)]
    assert len(out) == count
    for line in out:
        body = line["response"]["body"]
        assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"]
        assert line["response"]["request_id"]


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

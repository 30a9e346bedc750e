"""`azure-batch` deployments: bulk jobs offloaded to Azure OpenAI's Batch API, against the
strict mock's files and batches under /openai/ (mock_provider/azure_batches.py), which
check the api-version, Azure's auth and each batch file line (Azure's `/chat/completions`
url, the batch deployment as model), through a real Celery worker's poll loop.

An OpenAI-format job goes with an api-key, an Anthropic-format one through a deployment
without a key, on Entra ID tokens from the mock's managed identity endpoint: every line
is answered in its job's shape, by the batch deployment, billed at its prices, and the
mock saw one file and one download per provider batch and no refused call.
"""

import io
import json
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.config import Settings
from quotaflow.ingest import pipeline
from quotaflow.models import Job, Result
from quotaflow.results.output import iter_output
from quotaflow.tenants import spend
from tests.harness.cluster import start_provider, start_workers
from tests.harness.factories import chat_line, jsonl
from tests.harness.procs import Proc
from tests.harness.servers import REDIS_URL, service_env
from workers.dispatch import CeleryDispatcher

KEY_ENV, KEY = "QF_TEST_AZURE_BATCH_KEY", "azure-batch-key-0123456789"
API_VERSION = "2024-10-21"
BATCH_IN, BATCH_OUT = 0.5, 1.5

pytestmark = pytest.mark.timeout(240)


def _deployments(path: Path, url: str) -> None:
    common = (f'provider = "azure-batch"\nbase_url = "{url}"\napi_version = "{API_VERSION}"\n'
              f'input_per_mtok = {BATCH_IN}\noutput_per_mtok = {BATCH_OUT}\n')
    path.write_text(
        f'[deployments.azb]\n{common}model = "gpt-4o-batch"\napi_key_env = "{KEY_ENV}"\n'
        f'[deployments.azb-entra]\n{common}model = "gpt-4o-batch-entra"\n'
        '[routes]\n"gpt-4o-mini" = "azb"\n"claude-on-azure" = "azb-entra"\n')


def _wait(sessions: sessionmaker[Session], job_id: str, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while True:
        with sessions() as session:
            status = session.scalar(select(Job.status).where(Job.id == job_id))
        if status in ("completed", "failed", "expired", "cancelled"):
            return str(status)
        assert time.monotonic() < deadline, f"job {job_id} still {status}"
        time.sleep(0.3)


def test_bulk_jobs_go_through_azures_batch_api_with_a_key_and_with_entra_id(
        pg_url: str, pg_sessions: sessionmaker[Session], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.setenv("QUOTAFLOW_MOCK_BATCH_SECONDS", "0.5")
    procs: list[Proc] = []
    try:
        provider, url = start_provider(tmp_path, "--rpm", "600000", "--tpm", "100000000",
                                       "--api-key-env", KEY_ENV)
        procs.append(provider)
        path = tmp_path / "deployments.toml"
        _deployments(path, url)
        env = service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                          QUOTAFLOW_DEPLOYMENTS_FILE=str(path),
                          QUOTAFLOW_PROVIDER_BATCH_GATHER_S="0.3",
                          QUOTAFLOW_PROVIDER_BATCH_POLL_S="0.3",
                          QUOTAFLOW_PROVIDER_BATCH_LEASE_S="3",
                          QUOTAFLOW_WEBHOOK_DELIVERY="false",
                          IDENTITY_ENDPOINT=f"{url}/msi/token", IDENTITY_HEADER=KEY,
                          **{KEY_ENV: KEY})
        procs += start_workers(env, tmp_path, "azbatch", count=1)
        settings = Settings(database_url=pg_url, broker_url=REDIS_URL, deployments_file=path,
                            _env_file=None)
        # Given a bulk job of OpenAI lines and one of Anthropic lines
        openai_lines = [chat_line(f"o{i}", f"question {i} about the tides") for i in range(12)]
        anthropic_lines = [{"custom_id": f"a{i}", "params": {
            "model": "claude-on-azure", "max_tokens": 32, "system": "be brief",
            "messages": [{"role": "user", "content": f"question a{i} about the tides"}]}}
            for i in range(6)]
        job_ids = {shape: pipeline.create_job_in_process(
            pg_sessions, io.BytesIO(jsonl(lines)), settings=settings,
            deployments=settings.load_deployments(), dispatcher=CeleryDispatcher(REDIS_URL),
            queue="bulk").id
            for shape, lines in (("openai", openai_lines), ("anthropic", anthropic_lines))}
        # When the worker's poll loop offloads them
        statuses = {shape: _wait(pg_sessions, job_id) for shape, job_id in job_ids.items()}
        seen = httpx.get(f"{url}/azure/stats").json()
        stats = httpx.get(f"{url}/stats").json()
    finally:
        for proc in reversed(procs):
            proc.stop()
    # Then both completed through the Batch API, none called one by one
    assert statuses == {"openai": "completed", "anthropic": "completed"}, statuses
    assert stats["admitted"] == 0, stats
    assert seen["batch-files"] == 2 and seen["batch-downloads"] == 2, seen
    assert seen.get("api-key", 0) > 0 and seen.get("entra", 0) > 0, seen
    assert not [k for k in seen if k.startswith("refused")], seen
    with pg_sessions() as session:
        openai = [json.loads(x) for x in iter_output(session, job_ids["openai"], errors=False)]
        claude = [json.loads(x) for x in iter_output(session, job_ids["anthropic"],
                                                     errors=False)]
        by = dict(session.execute(select(Result.job_id, Result.deployment)
                                  .where(Result.job_id.in_(job_ids.values()))
                                  .group_by(Result.job_id, Result.deployment)).all())
        costs = {shape: spend.job_cost(session, job_id) for shape, job_id in job_ids.items()}
        tokens = session.execute(select(Result.job_id, Result.prompt_tokens,
                                        Result.completion_tokens)).all()
    # And every line is answered in its job's shape, by the batch deployment
    assert [line["custom_id"] for line in openai] == [f"o{i}" for i in range(12)]
    for i, line in enumerate(openai):
        body = line["response"]["body"]
        assert body["object"] == "chat.completion" and "prompt_filter_results" in body, line
        assert f"question {i} about" in body["choices"][0]["message"]["content"]
        assert body["model"] == "gpt-4o-batch" and line["response"]["request_id"]
    assert [line["custom_id"] for line in claude] == [f"a{i}" for i in range(6)]
    for i, line in enumerate(claude):
        message = line["result"]["message"]
        assert line["result"]["type"] == "succeeded" and message["type"] == "message", line
        assert f"question a{i} about" in message["content"][0]["text"]
    assert by == {job_ids["openai"]: "azb", job_ids["anthropic"]: "azb-entra"}
    # And billed at the batch deployments' prices
    for shape, job_id in job_ids.items():
        used = [(p, c) for j, p, c in tokens if j == job_id]
        want = sum(p * BATCH_IN + c * BATCH_OUT for p, c in used) / 1e6
        assert costs[shape]["total"] == pytest.approx(want) and want > 0, costs

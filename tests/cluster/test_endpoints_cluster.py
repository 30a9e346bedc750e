"""/v1/responses and /v1/moderations end to end: real Celery workers, Redis, Postgres,
the API, and the strict mock provider counting each request with quotaflow/budget/tokens.py.

A Response job and a moderation job run to OpenAI-shaped output lines with their usage;
the provider admitted exactly the tokens quotaflow counts (images by their rule, not
their base64); lines routed to a deployment that cannot serve their endpoint fail with
`unsupported_endpoint` while the rest of the job and another job run; and the official
`openai` SDK makes a /v1/responses batch through POST /v1/batches.
"""

import base64
import io
import json
import struct
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.budget.tokens import admission_tokens, prompt_tokens
from quotaflow.config import Settings
from quotaflow.db import session_factory
from quotaflow.ingest import pipeline
from quotaflow.jobs import service as jobs
from quotaflow.jobs import view as job_view
from quotaflow.results import output
from tests.harness.factories import jsonl, write_jsonl
from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import REDIS_URL, ROOT, flush_redis, service_env
from workers.dispatch import CeleryDispatcher

RESPONSES, MODERATIONS, CHAT = "/v1/responses", "/v1/moderations", "/v1/chat/completions"
PROVIDER_KEY = "sk-quotaflow-endpoints-0123456789abcdef"
DEFAULT_MAX_TOKENS = 300  # the deployments' and the mock's: counted alike on both sides
FINAL = ("completed", "failed", "expired", "cancelled")


@dataclass
class EndpointCluster:
    api_url: str
    provider_url: str
    settings: Settings
    sessions: sessionmaker[Session]
    env: dict[str, str]
    procs: dict[str, Proc]
    workdir: Path
    key: str

    def submit(self, lines: list[dict], queue: str = "realtime") -> str:
        job = pipeline.create_job_in_process(
            self.sessions, io.BytesIO(jsonl(lines)), settings=self.settings,
            deployments=self.settings.load_deployments(),
            dispatcher=CeleryDispatcher(self.settings.broker_url), queue=queue)
        return job.id

    def finish(self, job_id: str, timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            with self.sessions() as session:
                view = job_view.job_object(session, jobs.get_job(session, job_id))
            if view["status"] in FINAL:
                return view
            assert time.monotonic() < deadline, (
                f"{job_id} still {view['status']}: {view['request_counts']}\n"
                + "\n".join(p.log() for n, p in self.procs.items() if "worker" in n))
            time.sleep(0.3)

    def lines(self, job_id: str, errors: bool) -> list[dict]:
        with self.sessions() as session:
            return [json.loads(text) for text in output.iter_output(session, job_id, errors)]

    def stats(self) -> dict[str, Any]:
        return httpx.get(f"{self.provider_url}/stats", timeout=10).json()

    def reset_stats(self) -> None:
        httpx.post(f"{self.provider_url}/stats/reset", timeout=10).raise_for_status()


@pytest.fixture(scope="module")
def cluster(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EndpointCluster]:
    workdir = tmp_path_factory.mktemp("endpoints")
    flush_redis(REDIS_URL)
    ports = {name: free_port() for name in ("api", "provider")}
    provider_url = f"http://127.0.0.1:{ports['provider']}"
    deployments = workdir / "deployments.toml"
    common = (f'api_key_env = "QF_TEST_PROVIDER_KEY"\nrpm = 60000\ntpm = 50000000\n'
              f"default_max_tokens = {DEFAULT_MAX_TOKENS}\n")
    deployments.write_text(f"""
[deployments.gpt]
provider = "openai"
base_url = "{provider_url}/v1"
model = "gpt-model"
{common}
[deployments.claude]
provider = "anthropic"
base_url = "{provider_url}"
model = "claude-model"
{common}
[routes]
"claude" = "claude"
"both" = ["claude", "gpt"]
"*" = "gpt"
""")
    env = service_env(QF_TEST_PROVIDER_KEY=PROVIDER_KEY, PYTHONPATH=str(ROOT),
                      QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                      QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments))
    procs: dict[str, Proc] = {}
    try:
        procs["provider"] = Proc("provider", quotaflow(
            "mock-provider", "--port", str(ports["provider"]), "--rpm", "60000", "--tpm",
            "50000000", "--latency-ms", "5", "--default-max-tokens", str(DEFAULT_MAX_TOKENS),
            "--api-key-env", "QF_TEST_PROVIDER_KEY"), env, workdir)
        procs["api"] = Proc("api", quotaflow("api", "--port", str(ports["api"])), env, workdir)
        for n in (1, 2):
            procs[f"worker{n}"] = Proc(f"worker{n}", quotaflow(
                "worker", "--concurrency", "2", "--name", f"ep{n}@qftest"), env, workdir)
        procs["provider"].wait_http(f"{provider_url}/healthz")
        procs["api"].wait_http(f"http://127.0.0.1:{ports['api']}/healthz")
        for n in (1, 2):
            procs[f"worker{n}"].wait_until(lambda n=n: " ready." in procs[f"worker{n}"].log())
        made = subprocess.run(
            quotaflow("keys", "create", "--tenant", "team-ep"), env=env, capture_output=True,
            text=True, timeout=60, cwd=workdir)
        assert made.returncode == 0, made.stderr
        settings = Settings(database_url=pg_url, broker_url=REDIS_URL,
                            deployments_file=deployments, _env_file=None)
        yield EndpointCluster(f"http://127.0.0.1:{ports['api']}", provider_url, settings,
                              session_factory(pg_url), env, procs, workdir,
                              made.stdout.strip())
    finally:
        for proc in reversed(procs.values()):
            proc.stop()


def png_data_url(width: int, height: int) -> str:
    header = (b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR"
              + struct.pack(">II", width, height) + b"\x08\x02\x00\x00\x00")
    return "data:image/png;base64," + base64.b64encode(header + b"\x7f" * 60_000).decode()


def response_line(i: int) -> dict:
    """Four kinds of Response request, in turn: a string; text and a large PNG (high
    detail, 1105 tokens, 80,000 base64 characters); a low-detail image URL and a file;
    no max_output_tokens (the deployment's default ceiling)."""
    question = f"question {i} about the tides"
    body: dict[str, Any] = {"model": "gpt-4.1", "max_output_tokens": 40 + i}
    kind = i % 4
    if kind == 0:
        body["input"] = question
    elif kind == 1:
        body["instructions"] = "Answer in one sentence."
        body["input"] = [{"role": "user", "content": [
            {"type": "input_text", "text": question},
            {"type": "input_image", "image_url": png_data_url(2048, 4096), "detail": "high"}]}]
    elif kind == 2:
        body["input"] = [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [
                {"type": "input_text", "text": question},
                {"type": "input_image", "image_url": "https://example.com/t.png",
                 "detail": "low"},
                {"type": "input_file", "file_id": "file-tides"}]}]
    else:
        del body["max_output_tokens"]
        body["instructions"] = "Answer in one sentence."
        body["input"] = question
    return {"custom_id": f"r-{i}", "method": "POST", "url": RESPONSES, "body": body}


def moderation_line(i: int, model: str = "omni-moderation-latest") -> dict:
    kind = i % 3
    if kind == 0:
        value: Any = f"message {i} about the weather"
    elif kind == 1:
        value = [f"message {i} is kind", f"message {i} threatens violence"]
    else:
        value = [{"type": "text", "text": f"caption {i}"},
                 {"type": "image_url", "image_url": {"url": png_data_url(1024, 1024)}}]
    return {"custom_id": f"m-{model}-{i}", "method": "POST", "url": MODERATIONS,
            "body": {"model": model, "input": value}}


def test_a_responses_job_runs_to_response_objects_admitted_as_quotaflow_counts(
        cluster: EndpointCluster) -> None:
    # Given 24 Response requests of four kinds, two in four with images
    lines = [response_line(i) for i in range(24)]
    cluster.reset_stats()
    # When they run as a job through the workers
    view = cluster.finish(cluster.submit(lines))
    # Then every line has a Response object, answering its own question, from the
    # deployment's model, with the Responses API's usage
    assert view["status"] == "completed" and view["request_counts"]["failed"] == 0, view
    out = cluster.lines(view["id"], errors=False)
    assert [o["custom_id"] for o in out] == [line["custom_id"] for line in lines]
    inputs = outputs = 0
    for line, got in zip(lines, out, strict=True):
        body = got["response"]["body"]
        assert got["response"]["status_code"] == 200 and got["error"] is None
        assert body["object"] == "response" and body["status"] == "completed"
        assert body["id"].startswith("resp_") and body["model"] == "gpt-model"
        i = int(line["custom_id"][2:])
        text = body["output"][0]["content"][0]["text"]
        assert text == f"simulated reply to: question {i} about the tides"
        usage = body["usage"]
        assert usage["input_tokens"] == prompt_tokens(RESPONSES, line["body"])
        assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
        inputs, outputs = inputs + usage["input_tokens"], outputs + usage["output_tokens"]
    # And the job's usage adds the Responses usage up (input/output_tokens, not prompt_/
    # completion_tokens)
    assert (view["usage"]["input_tokens"], view["usage"]["output_tokens"]) == (inputs, outputs)
    assert inputs > 6 * 1105  # the six large images at their tile price
    # And the provider admitted every request once, at exactly quotaflow's count, never a 429
    stats = cluster.stats()
    assert (stats["admitted"], stats["rejected_429"], stats["duplicate_bodies"]) == (24, 0, 0)
    assert stats["tokens_admitted"] == sum(
        admission_tokens(RESPONSES, line["body"], DEFAULT_MAX_TOKENS) for line in lines)
    assert stats["prompt_tokens"] == inputs and stats["completion_tokens"] == outputs
    # (the base64 of the images, 80,000 characters each, was not counted as text)
    assert stats["tokens_admitted"] < 24 * (DEFAULT_MAX_TOKENS + 1105 + 100)


def test_a_moderations_job_runs_to_moderation_objects_with_no_output_tokens(
        cluster: EndpointCluster) -> None:
    lines = [moderation_line(i) for i in range(12)]
    cluster.reset_stats()
    view = cluster.finish(cluster.submit(lines, queue="standard"))
    assert view["status"] == "completed" and view["request_counts"]["completed"] == 12, view
    out = cluster.lines(view["id"], errors=False)
    assert [o["custom_id"] for o in out] == [line["custom_id"] for line in lines]
    for line, got in zip(lines, out, strict=True):
        body = got["response"]["body"]
        assert body["id"].startswith("modr-") and body["model"] == "gpt-model"
        value = line["body"]["input"]
        flagged = [r["flagged"] for r in body["results"]]
        if isinstance(value, str):
            assert flagged == [False]
        elif isinstance(value[0], str):
            assert flagged == [False, True]  # "... threatens violence"
        else:
            [result] = body["results"]
            assert result["category_applied_input_types"]["violence"] == ["text", "image"]
    # Then no usage is reported (moderations have none) and the provider admitted the
    # inputs alone: no output ceiling, the images at 765 each
    assert (view["usage"]["input_tokens"], view["usage"]["output_tokens"]) == (0, 0)
    stats = cluster.stats()
    assert (stats["admitted"], stats["rejected_429"]) == (12, 0)
    admitted = sum(admission_tokens(MODERATIONS, line["body"], DEFAULT_MAX_TOKENS)
                   for line in lines)
    assert stats["tokens_admitted"] == admitted < 4 * 765 + 12 * 20


def test_lines_a_deployment_cannot_serve_fail_clearly_and_nothing_else(
        cluster: EndpointCluster) -> None:
    # Given a moderations job whose lines name models served by the anthropic deployment
    # (which answers chat only), by a route of it and an OpenAI one, and by OpenAI alone;
    # and at the same time a chat job on the anthropic deployment
    moderations = [moderation_line(i, model) for i in range(4)
                   for model in ("claude", "both", "gpt-model")]
    chats = [{"custom_id": f"c-{i}", "method": "POST", "url": CHAT, "body": {
        "model": "claude", "max_tokens": 20,
        "messages": [{"role": "user", "content": f"hello {i}"}]}} for i in range(6)]
    cluster.reset_stats()
    moderation_job, chat_job = cluster.submit(moderations), cluster.submit(chats)
    moderation_view, chat_view = cluster.finish(moderation_job), cluster.finish(chat_job)
    # Then the anthropic deployment's lines fail, naming the deployment and the endpoint,
    # with a code of their own; the "both" route's go to the OpenAI deployment
    assert moderation_view["request_counts"] == {**moderation_view["request_counts"],
                                                 "completed": 8, "failed": 4}
    errors = cluster.lines(moderation_job, errors=True)
    assert [e["custom_id"] for e in errors] == [f"m-claude-{i}" for i in range(4)]
    for error in errors:
        assert error["response"] is None and error["error"]["code"] == "unsupported_endpoint"
        assert ("deployment 'claude' (provider anthropic) does not serve /v1/moderations"
                in error["error"]["message"])
    served = cluster.lines(moderation_job, errors=False)
    assert {o["custom_id"].rsplit("-", 1)[0] for o in served} == {"m-both", "m-gpt-model"}
    assert all(o["response"]["body"]["model"] == "gpt-model" for o in served)
    # And the chat job on the same deployment is untouched: answered through /v1/messages
    assert chat_view["status"] == "completed" and chat_view["request_counts"]["completed"] == 6
    # And the provider never saw a refused line: 8 moderations and 6 chats were admitted
    assert cluster.stats()["admitted"] == 14


def test_the_openai_sdk_makes_a_responses_batch(cluster: EndpointCluster) -> None:
    client = openai.OpenAI(base_url=f"{cluster.api_url}/v1", api_key=cluster.key,
                           max_retries=0)
    lines = [response_line(4 * i) for i in range(5)]
    path = write_jsonl(cluster.workdir / "responses.jsonl", lines)
    uploaded = client.files.create(file=path, purpose="batch")
    created = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/responses",
                                    completion_window="24h",
                                    metadata={"quotaflow_queue": "realtime"})
    assert created.endpoint == "/v1/responses"
    deadline = time.monotonic() + 120
    while (batch := client.batches.retrieve(created.id)).status not in FINAL:
        assert time.monotonic() < deadline, batch
        time.sleep(0.3)
    assert batch.status == "completed" and batch.request_counts.completed == 5, batch
    assert batch.usage.input_tokens > 0 and batch.usage.output_tokens > 0
    out = [json.loads(text) for text in
           client.files.content(batch.output_file_id).text.splitlines()]
    assert [o["custom_id"] for o in out] == [line["custom_id"] for line in lines]
    assert all(o["response"]["body"]["object"] == "response" for o in out)
    # And an endpoint OpenAI's Batch API does not have is still refused, naming the five
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/images",  # type: ignore[arg-type]
                              completion_window="24h")
    assert "/v1/moderations" in str(refused.value)

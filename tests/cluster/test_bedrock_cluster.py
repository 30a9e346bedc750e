"""Bedrock deployments through real Celery workers against the strict mock's Bedrock routes,
which recompute every request's SigV4 signature from the test's secret.

The conformance set's chat lines (OpenAI's and Anthropic's) go to a Converse and an
InvokeModel deployment; the bodies the mock received are checked field by field against
tests/harness/conformance/bedrock.json, refused lines must fail naming their field and
never be sent, and every answer comes back in the job's output shape. Then four workers
share one deployment at the mock's limits: zero 429s, answers in the shape each job asked.
"""

import io
import json
import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.config import Settings
from quotaflow.constants import ENDPOINT_CHAT
from quotaflow.ingest import pipeline
from quotaflow.results.output import iter_output
from tests.cluster.test_conformance_cluster import check_answer, check_refused, run
from tests.harness import conformance
from tests.harness.bedrock_cluster import MODEL, aws_env, deployment, start_mock
from tests.harness.cluster import start_workers, wait_until_finished
from tests.harness.factories import jsonl
from tests.harness.servers import REDIS_URL
from workers.dispatch import CeleryDispatcher

APIS = {"converse": "to-converse", "invoke": "to-invoke"}
EXPECTED = json.loads((conformance.HERE / "bedrock.json").read_text(encoding="utf-8"))


def job_lines(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for entry in entries:
        for api, route in APIS.items():
            line = json.loads(json.dumps(entry["line"]))
            line["custom_id"] = f"{entry['name']}>{api}"
            (line["body"] if "body" in line else line["params"])["model"] = route
            out.append(line)
    return out


def schema_parsed(body: dict[str, Any]) -> dict[str, Any]:
    """Converse's JSON schema (JSON text) as the JSON it holds: the store keeps a line's
    objects, not the order of their keys (PostgreSQL's jsonb), so the text differs."""
    body = json.loads(json.dumps(body))
    spec = ((body.get("outputConfig") or {}).get("textFormat") or {}).get("structure") or {}
    if isinstance((spec.get("jsonSchema") or {}).get("schema"), str):
        spec["jsonSchema"]["schema"] = json.loads(spec["jsonSchema"]["schema"])
    return body


def check_file(entries: list[dict[str, Any]], output: dict[str, dict],
               received: list[dict[str, Any]]) -> list[str]:
    """What differs from bedrock.json's expectations, one sentence each."""
    problems, sent = [], 0
    for entry in entries:
        for api in APIS:
            want, line = EXPECTED[entry["name"]][api], output[f"{entry['name']}>{api}"]
            if "error" in want:
                check_refused(line, want["error"])
                continue
            sent += 1
            check_answer(line, entry)
            path = f"/model/{MODEL}/{api}"
            bodies = [r["body"] for r in received
                      if r["path"] == path and r["body"]["messages"] == want["messages"]]
            if len(bodies) != 1:
                problems.append(f"{entry['name']} -> {api}: {len(bodies)} requests with the "
                                "expected messages")
                continue
            problems += [f"{entry['name']} -> {api}: {diff}"
                         for diff in conformance.field_diff(schema_parsed(want),
                                                            schema_parsed(bodies[0]))]
    if len(received) != sent:
        problems.append(f"the mock received {len(received)} requests, {sent} expected")
    return problems


def test_the_conformance_chat_lines_through_converse_and_invoke(
        pg_url: str, pg_sessions: sessionmaker[Session], redis_url: str,
        tmp_path: Path) -> None:
    record = tmp_path / "received.jsonl"
    mock, url = start_mock(tmp_path, "--rpm", "600000", "--tpm", "100000000",
                           "--latency-ms", "5", "--record", str(record))
    procs = [mock]
    try:
        path = tmp_path / "deployments.toml"
        path.write_text(deployment("converse", url) + deployment("invoke", url, "invoke")
                        + '[routes]\n"to-converse" = "converse"\n"to-invoke" = "invoke"\n')
        env = aws_env(tmp_path, QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                      QUOTAFLOW_DEPLOYMENTS_FILE=str(path))
        procs += start_workers(env, tmp_path, "bedrock-conf", count=1)
        settings = Settings(database_url=pg_url, broker_url=REDIS_URL, batch_size=10,
                            deployments_file=path, _env_file=None)
        problems: list[str] = []
        for name in ("chat_openai", "messages_anthropic"):
            record.unlink(missing_ok=True)
            entries = conformance.lines(name)
            output = run(pg_sessions, settings, job_lines(entries))
            received = ([json.loads(line) for line in record.read_text().splitlines()]
                        if record.exists() else [])
            problems += check_file(entries, output, received)
        assert problems == [], "\n".join(problems)
        assert httpx.get(f"{url}/stats").json()["rejected_429"] == 0
    finally:
        for proc in reversed(procs):
            proc.stop()


# Tokens bind: the burst (5 s) holds 25 requests of 40 tokens (10 of prompt, 30 of
# max_tokens); after each answer 17 unused come back, so 23 a request, about 13 a second.
RPM, TPM, BURST_S, LINES = 60_000, 18_000, 5, 80


def load_lines(anthropic: bool) -> list[dict[str, Any]]:
    """Prompts of 10 tokens ("be brief" and the question, as both sides count them)."""
    out = []
    for i in range(LINES):
        question = f"question {'a' if anthropic else 'o'}{i:04d} about the tides"
        if anthropic:
            out.append({"custom_id": f"a{i}", "params": {
                "model": "claude-bedrock", "max_tokens": 30, "system": "be brief",
                "messages": [{"role": "user", "content": question}]}})
        else:
            out.append({"custom_id": f"o{i}", "method": "POST", "url": ENDPOINT_CHAT, "body": {
                "model": "claude-bedrock", "max_tokens": 30, "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": question}]}})
    return out


def test_four_workers_share_the_limits_of_a_bedrock_deployment_without_a_429(
        pg_url: str, pg_sessions: sessionmaker[Session], redis_url: str,
        tmp_path: Path) -> None:
    mock, url = start_mock(tmp_path, "--rpm", str(RPM), "--tpm", str(TPM), "--burst-seconds",
                           str(BURST_S), "--latency-ms", "20", "--reconcile")
    procs = [mock]
    try:
        path = tmp_path / "deployments.toml"
        path.write_text(deployment("bedrock", url, rpm=RPM, tpm=TPM, extra=(
            f"burst_seconds = {BURST_S}\nreconcile_usage = true\n"))
            + '[routes]\n"claude-bedrock" = "bedrock"\n')
        env = aws_env(tmp_path, QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=redis_url,
                      QUOTAFLOW_DEPLOYMENTS_FILE=str(path))
        procs += start_workers(env, tmp_path, "bedrock-load", count=4)
        settings = Settings(database_url=pg_url, broker_url=redis_url, batch_size=5,
                            largest_batch_size=5, deployments_file=path, _env_file=None)
        jobs = {}
        started = time.monotonic()
        for shape in ("openai", "anthropic"):
            jobs[shape] = pipeline.create_job_in_process(
                pg_sessions, io.BytesIO(jsonl(load_lines(shape == "anthropic"))),
                settings=settings, deployments=settings.load_deployments(),
                dispatcher=CeleryDispatcher(redis_url), queue="standard").id
        for job_id in jobs.values():
            assert wait_until_finished(pg_sessions, job_id, started, 180, LINES) == "completed"
        stats = httpx.get(f"{url}/stats").json()
        assert stats["rejected_429"] == 0, stats
        assert stats["admitted"] == 2 * LINES and stats["duplicate_bodies"] == 0, stats
        kept = stats["tokens_admitted"] - stats["tokens_refunded"]
        assert kept > 2 * TPM * BURST_S / 60, stats  # the limit's refill was spent, not a burst
        with pg_sessions() as session:
            openai = [json.loads(x) for x in iter_output(session, jobs["openai"], errors=False)]
            claude = [json.loads(x) for x in iter_output(session, jobs["anthropic"],
                                                         errors=False)]
        assert len(openai) == len(claude) == LINES
        for line in openai:
            body = line["response"]["body"]
            assert line["error"] is None and body["object"] == "chat.completion", line
            assert body["choices"][0]["message"]["content"].startswith("simulated reply to: ")
            assert body["usage"]["prompt_tokens"] == 10, line
        for line in claude:
            result = line["result"]
            assert result["type"] == "succeeded" and result["message"]["type"] == "message"
            assert result["message"]["content"][0]["text"].startswith("simulated reply to: ")
    finally:
        for proc in reversed(procs):
            proc.stop()

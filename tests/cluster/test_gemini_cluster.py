"""gemini and vertex deployments through real Celery workers, against the strict mock's
generateContent (Google's URL shapes, x-goog-api-key, bearer tokens from its local OAuth
endpoint, Google's 400s and 429 RESOURCE_EXHAUSTED).

The conformance set's chat lines (OpenAI's and Anthropic's) go through each kind, the
bodies the mock recorded checked field by field against conformance/gemini/expected.jsonl
and the refused lines failing by name, never sent; then four workers share one
Google quota at the mock's limits with no 429, answering in the shape each job asked.
"""

import asyncio
import io
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from google.auth.transport.requests import Request
from google.oauth2 import service_account
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.config import Settings
from quotaflow.constants import OUTPUT_ANTHROPIC
from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import RetryableProviderError
from quotaflow.ingest import pipeline
from quotaflow.jobs import service as jobs
from quotaflow.providers.gemini import GeminiProvider
from quotaflow.results.output import iter_output
from tests.cluster.test_conformance_cluster import check_answer, check_refused, run
from tests.harness import conformance
from tests.harness.cluster import start_workers
from tests.harness.conformance import field_diff
from tests.harness.factories import jsonl
from tests.harness.gemini_cluster import (
    KEY,
    KEY_ENV,
    ROUTES,
    deployments_toml,
    expected,
    path_of,
    start_google_mock,
    worker_env,
)
from workers.dispatch import CeleryDispatcher

CHAT_FILES = ("chat_openai", "messages_anthropic")


def job_lines(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for entry in entries:
        for kind, (route, _) in ROUTES.items():
            line = json.loads(json.dumps(entry["line"]))
            line["custom_id"] = f"{entry['name']}>{kind}"
            (line["body"] if "body" in line else line["params"])["model"] = route
            out.append(line)
    return out


def check_file(entries: list[dict[str, Any]], output: dict[str, dict],
               received: list[dict[str, Any]]) -> list[str]:
    """What differs from the expected generateContent bodies, one sentence each."""
    wanted = expected()
    problems: list[str] = []
    sent = 0
    for entry in entries:
        want = wanted[entry["name"]]
        for kind, (_, model) in ROUTES.items():
            line = output[f"{entry['name']}>{kind}"]
            if "error" in want:
                check_refused(line, want["error"])
                continue
            sent += 1
            check_answer(line, entry)
            bodies = [r["body"] for r in received if r["path"] == path_of(kind, model)
                      and r["body"].get("contents") == want["contents"]]
            if len(bodies) != 1:
                problems.append(f"{entry['name']} -> {kind}: {len(bodies)} requests with the "
                                "expected contents")
                continue
            problems += [f"{entry['name']} -> {kind}: {diff}"
                         for diff in field_diff(want, bodies[0])]
    if len(received) != sent:  # a refused line was never sent, nor anything twice
        problems.append(f"the mock received {len(received)} requests, {sent} expected")
    return problems


def test_the_conformance_chat_lines_through_gemini_and_vertex(
        pg_url: str, pg_sessions: sessionmaker[Session], redis_url: str, tmp_path: Path,
        monkeypatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    record = tmp_path / "received.jsonl"
    procs = []
    try:
        provider, url, account = start_google_mock(
            tmp_path, "--rpm", "600000", "--tpm", "100000000", "--latency-ms", "5",
            "--record", str(record))
        procs.append(provider)
        path = tmp_path / "deployments.toml"
        path.write_text(deployments_toml(url, account, 600000, 100000000))
        procs += start_workers(worker_env(pg_url, redis_url, path), tmp_path, "gemini",
                               count=1)
        settings = Settings(database_url=pg_url, broker_url=redis_url, batch_size=10,
                            deployments_file=path, _env_file=None)
        problems: list[str] = []
        for name in CHAT_FILES:
            record.unlink(missing_ok=True)
            entries = conformance.lines(name)
            output = run(pg_sessions, settings, job_lines(entries))
            received = [json.loads(line) for line in record.read_text().splitlines()]
            problems += check_file(entries, output, received)
        assert problems == [], "\n".join(problems)
        stats = httpx.get(f"{url}/stats").json()
        assert stats["rejected_429"] == 0, stats
    finally:
        for proc in reversed(procs):
            proc.stop()


# The mock's limits: 20 requests a second, 5 s of burst; tokens never bind.
RPM, BURST_S, LINES_PER_JOB = 1200, 5.0, 90


def limit_lines(job: str, anthropic: bool) -> list[dict[str, Any]]:
    """Lines alternating between the two kinds, each prompt its own."""
    out = []
    for i in range(LINES_PER_JOB):
        route = ROUTES["gemini" if i % 2 else "vertex"][0]
        messages = [{"role": "user", "content": f"{job} question {i:04d} about the tides"}]
        if anthropic:
            out.append({"custom_id": f"{job}-{i}", "params": {
                "model": route, "max_tokens": 20, "system": "be brief", "messages": messages}})
        else:
            out.append({"custom_id": f"{job}-{i}", "method": "POST",
                        "url": "/v1/chat/completions", "body": {
                            "model": route, "max_tokens": 20, "messages": [
                                {"role": "system", "content": "be brief"}, *messages]}})
    return out


def test_four_workers_share_one_google_quota_without_a_429(
        pg_url: str, pg_sessions: sessionmaker[Session], redis_url: str, tmp_path: Path,
        monkeypatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    procs = []
    try:
        provider, url, account = start_google_mock(
            tmp_path, "--rpm", str(RPM), "--tpm", "10000000", "--burst-seconds", str(BURST_S),
            "--latency-ms", "20")
        procs.append(provider)
        path = tmp_path / "deployments.toml"
        path.write_text(deployments_toml(url, account, RPM, 10000000, BURST_S))
        procs += start_workers(worker_env(pg_url, redis_url, path), tmp_path, "gemlim",
                               count=4)
        settings = Settings(database_url=pg_url, broker_url=redis_url, batch_size=5,
                            largest_batch_size=5, deployments_file=path, _env_file=None)
        specs = {"openai": (False, None), "openai-as-anthropic": (False, OUTPUT_ANTHROPIC),
                 "anthropic": (True, None)}
        created = {}
        for job, (anthropic, output_format) in specs.items():
            created[job] = pipeline.create_job_in_process(
                pg_sessions, io.BytesIO(jsonl(limit_lines(job, anthropic))), settings=settings,
                deployments=settings.load_deployments(),
                dispatcher=CeleryDispatcher(settings.broker_url), queue="realtime",
                output_format=output_format).id
        deadline = time.monotonic() + 180
        for job_id in created.values():
            while True:
                with pg_sessions() as session:
                    if jobs.get_job(session, job_id).status != "in_progress":
                        break
                assert time.monotonic() < deadline, "the jobs did not end in 180 s"
                time.sleep(0.5)
        stats = httpx.get(f"{url}/stats").json()
        assert stats["rejected_429"] == 0, stats
        assert stats["admitted"] == 3 * LINES_PER_JOB and stats["duplicate_bodies"] == 0, stats
        # The budget was spent, not idled: all but the burst at about 20 a second.
        seconds = stats["last_admitted_at"] - stats["first_admitted_at"]
        assert seconds < 2 * (3 * LINES_PER_JOB - RPM * BURST_S / 60) / (RPM / 60) + 5, stats
        for job, job_id in created.items():
            with pg_sessions() as session:
                lines = [json.loads(line) for line in iter_output(session, job_id, errors=False)]
                errors = list(iter_output(session, job_id, errors=True))
            assert len(lines) == LINES_PER_JOB and errors == [], (job, errors[:2])
            for line in lines:
                if specs[job][0] or specs[job][1] == OUTPUT_ANTHROPIC:
                    message = line["result"]["message"]
                    assert line["result"]["type"] == "succeeded", line
                    assert message["type"] == "message" and message["content"][0][
                        "text"].startswith("simulated reply to: "), line
                else:
                    body = line["response"]["body"]
                    assert body["object"] == "chat.completion", line
                    assert body["choices"][0]["message"]["content"].startswith(
                        "simulated reply to: "), line
    finally:
        for proc in reversed(procs):
            proc.stop()


def test_the_mock_holds_requests_to_googles_wire_contract(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The mock refuses what Google refuses, so the tests above prove something: a wrong
    key or token, another project, unknown fields, a JSON Schema keyword outside Gemini's
    subset; and past its limit it answers 429 RESOURCE_EXHAUSTED with a RetryInfo, which
    the provider reads as a rate limit with that wait."""
    monkeypatch.setenv(KEY_ENV, KEY)
    # Two requests of burst, then one each 10 s: the 429s below cannot be outwaited.
    proc, url, account = start_google_mock(tmp_path, "--rpm", "6", "--tpm", "100000",
                                           "--burst-seconds", "20", "--latency-ms", "0")
    try:
        body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
                "generationConfig": {"maxOutputTokens": 5}}
        gemini = f"{url}{path_of('gemini', 'm')}"
        assert httpx.post(gemini, json=body, headers={"x-goog-api-key": "wrong"}
                          ).json()["error"]["status"] == "UNAUTHENTICATED"
        for bad in ({**body, "model": "m"}, {**body, "generationConfig": {
                "responseMimeType": "application/json", "responseSchema": {
                    "type": "object", "additionalProperties": False}}}):
            refused = httpx.post(gemini, json=bad, headers={"x-goog-api-key": KEY}).json()
            assert refused["error"]["status"] == "INVALID_ARGUMENT", refused
        credentials = service_account.Credentials.from_service_account_file(
            str(account), scopes=["https://www.googleapis.com/auth/cloud-platform"])
        credentials.refresh(Request())  # google-auth's own flow, against the mock's /token
        bearer = {"authorization": f"Bearer {credentials.token}"}
        vertex = f"{url}{path_of('vertex', 'm')}"
        assert httpx.post(vertex, json=body, headers={"authorization": "Bearer forged"}
                          ).status_code == 401
        assert httpx.post(vertex.replace("qf-test-project", "other"), json=body,
                          headers=bearer).status_code == 403
        assert httpx.post(vertex, json=body, headers=bearer).status_code == 200
        assert httpx.post(gemini, json=body, headers={"x-goog-api-key": KEY}).status_code == 200
        limited = httpx.post(gemini, json=body, headers={"x-goog-api-key": KEY})
        error = limited.json()["error"]
        assert limited.status_code == 429 and error["status"] == "RESOURCE_EXHAUSTED", error
        assert "retry-after" not in limited.headers
        delay = next(d["retryDelay"] for d in error["details"] if d["@type"].endswith(
            "RetryInfo"))
        provider = GeminiProvider(Deployment(
            name="g", provider="gemini", base_url=f"{url}/v1beta", model="m",
            api_key_env=KEY_ENV, rpm=6, tpm=100000))

        async def call() -> None:
            try:
                await provider.send("/v1/chat/completions", body)
            finally:
                await provider.aclose()

        with pytest.raises(RetryableProviderError) as caught:
            asyncio.run(call())
        assert caught.value.status_code == 429 and 0 < caught.value.retry_after <= 10
        assert 0 < float(delay.removesuffix("s")) <= 10
    finally:
        proc.stop()

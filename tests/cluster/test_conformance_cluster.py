"""The conformance set (tests/harness/conformance/) as jobs through real Celery workers, against
the strict mock provider recording every request body it receives (`--record`).

Each file is one job holding every entry twice: once routed to an OpenAI-compatible
deployment, once to an anthropic one (both at the same mock: /v1/chat/completions and
/v1/messages, each refusing the other family's shapes with a 400). The bodies the mock
received are checked field by field against the set's expectations, the refused lines
must never have been sent and must fail naming their field, and every other line must
answer in the job's output format.
"""

import io
import json
import time
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from quotaflow.config import Settings
from quotaflow.ingest import pipeline
from quotaflow.jobs import service as jobs
from quotaflow.results.output import iter_output
from tests.harness import conformance
from tests.harness.cluster import start_provider, start_workers
from tests.harness.conformance import comparable, field_diff
from tests.harness.factories import jsonl
from tests.harness.servers import REDIS_URL, service_env
from workers.dispatch import CeleryDispatcher

KEY_ENV = "QF_TEST_CONFORMANCE_KEY"
# The model a line names picks the family it goes to; each deployment sets its own.
ROUTES = {"openai": ("to-openai", "gpt-conf", "/v1/chat/completions"),
          "anthropic": ("to-anthropic", "claude-conf", "/v1/messages")}


def deployments_toml(url: str) -> str:
    return (f'[deployments.gpt]\nprovider = "openai"\nbase_url = "{url}/v1"\n'
            f'model = "gpt-conf"\napi_key_env = "{KEY_ENV}"\nrpm = 600000\ntpm = 100000000\n'
            f'[deployments.claude]\nprovider = "anthropic"\nbase_url = "{url}"\n'
            f'model = "claude-conf"\napi_key_env = "{KEY_ENV}"\nrpm = 600000\n'
            'itpm = 100000000\notpm = 100000000\n'
            '[routes]\n"to-openai" = "gpt"\n"to-anthropic" = "claude"\n')


def job_lines(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for entry in entries:
        for family, (route, _, _) in ROUTES.items():
            line = json.loads(json.dumps(entry["line"]))
            line["custom_id"] = f"{entry['name']}>{family}"
            (line["body"] if "body" in line else line["params"])["model"] = route
            out.append(line)
    return out


def run(sessions: sessionmaker[Session], settings: Settings, lines: list[dict]
        ) -> dict[str, dict]:
    """The job's output and error lines by custom_id, once it has ended."""
    job = pipeline.create_job_in_process(
        sessions, io.BytesIO(jsonl(lines)), settings=settings,
        deployments=settings.load_deployments(), dispatcher=CeleryDispatcher(settings.broker_url),
        queue="realtime")
    deadline = time.monotonic() + 120
    while True:
        with sessions() as session:
            if jobs.get_job(session, job.id).status != "in_progress":
                break
        assert time.monotonic() < deadline, "the conformance job did not end in 120 s"
        time.sleep(0.3)
    with sessions() as session:
        got = [json.loads(line) for errors in (False, True)
               for line in iter_output(session, job.id, errors=errors)]
    return {line["custom_id"]: line for line in got}


# The object an OpenAI output line's body is, by endpoint.
OBJECTS = {"/v1/chat/completions": "chat.completion", "/v1/responses": "response",
           "/v1/completions": "text_completion", "/v1/embeddings": "list"}


def check_answer(line: dict[str, Any], entry: dict[str, Any]) -> None:
    """An answer in the job's own format: OpenAI lines the endpoint's object (a
    chat.completion for chat), Anthropic lines a succeeded Message, whichever family
    answered."""
    if "params" in entry["line"]:
        assert line["result"]["type"] == "succeeded", line
        assert line["result"]["message"]["type"] == "message", line
        return
    assert line["error"] is None and line["response"]["status_code"] == 200, line
    body = line["response"]["body"]
    url = conformance.url(entry)
    if url == "/v1/moderations":
        assert body["id"].startswith("modr-") and body["results"], line
        return
    assert body["object"] == OBJECTS[url], line
    choice = body.get("choices", [{}])[0]
    if choice.get("finish_reason") == "tool_calls":  # a forced tool call, made over
        call = choice["message"]["tool_calls"][0]
        assert call["type"] == "function" and json.loads(call["function"]["arguments"])


def check_unsupported(line: dict[str, Any], url: str) -> None:
    """Failed before any call, naming the endpoint and the deployment."""
    assert line["response"] is None and line["error"]["code"] == "unsupported_endpoint", line
    assert url in line["error"]["message"] and "'claude'" in line["error"]["message"], line


def check_refused(line: dict[str, Any], field: str) -> None:
    if "result" in line:
        error = line["result"]["error"]["error"]
        assert line["result"]["type"] == "errored" and error["type"] == (
            "invalid_request_error"), line
        message = error["message"]
    else:
        assert line["response"] is None and line["error"]["code"] == "invalid_request", line
        message = line["error"]["message"]
    assert f"{field} has no" in message or f"{field} (" in message, message


def test_the_conformance_set_through_workers_and_the_recording_mock(
        pg_url: str, pg_sessions: sessionmaker[Session], redis_url: str, tmp_path: Path,
        monkeypatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-conformance")
    record = tmp_path / "received.jsonl"
    procs = []
    try:
        provider, url = start_provider(tmp_path, "--rpm", "600000", "--tpm", "100000000",
                                       "--itpm", "100000000", "--otpm", "100000000",
                                       "--latency-ms", "5", "--record", str(record))
        procs.append(provider)
        path = tmp_path / "deployments.toml"
        path.write_text(deployments_toml(url))
        env = service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                          QUOTAFLOW_DEPLOYMENTS_FILE=str(path), **{KEY_ENV: "sk-conformance"})
        procs += start_workers(env, tmp_path, "conformance", count=1)
        settings = Settings(database_url=pg_url, broker_url=REDIS_URL, batch_size=10,
                            deployments_file=path, _env_file=None)
        problems: list[str] = []
        for name in conformance.names():
            record.unlink(missing_ok=True)
            entries = conformance.lines(name)
            output = run(pg_sessions, settings, job_lines(entries))
            received = [json.loads(line) for line in record.read_text().splitlines()]
            problems += check_file(entries, output, received)
        assert problems == [], "\n".join(problems)
    finally:
        for proc in reversed(procs):
            proc.stop()


def prompt_of(body: dict[str, Any]) -> Any:
    return body.get("messages", body.get("input", body.get("prompt")))


def check_file(entries: list[dict[str, Any]], output: dict[str, dict],
               received: list[dict[str, Any]]) -> list[str]:
    """What differs from the set's expectations, one sentence each."""
    problems = []
    sent = 0
    for entry in entries:
        for family, (_, model, path) in ROUTES.items():
            want = conformance.expected(entry, family)
            line = output[f"{entry['name']}>{family}"]
            if "unsupported" in want:
                check_unsupported(line, conformance.url(entry))
                continue
            if "error" in want:
                check_refused(line, want["error"])
                continue
            sent += 1
            check_answer(line, entry)
            # Paired by their prompt (messages, input or prompt), unique in the set.
            target = prompt_of(comparable(want))
            where = conformance.url(entry) if family == "openai" else path
            bodies = [r["body"] for r in received if r["path"] == where
                      and prompt_of(comparable(r["body"])) == target]
            if len(bodies) != 1:
                problems.append(f"{entry['name']} -> {family}: {len(bodies)} requests with "
                                f"the expected prompt {target!r}")
                continue
            got = dict(bodies[0])
            if got.pop("model", None) != model:
                problems.append(f"{entry['name']} -> {family}: model not {model}")
            problems += [f"{entry['name']} -> {family}: {diff}"
                         for diff in field_diff(want, got)]
    if len(received) != sent:  # a refused line was never sent, nor anything twice
        problems.append(f"the mock received {len(received)} requests, {sent} expected")
    return problems

"""Anthropic deployments against the strict mock of the Messages API, in real processes.

Output formats and error handling run through the executor in this process (as
`quotaflow run` does) with PostgreSQL, the Redis limiter and a mock provider
process; the limits run through Celery workers sharing the budget: each of RPM,
ITPM and OTPM binds in turn with zero 429s and the binding limit nearly fully
used, while a deployment counting one combined tpm meets the provider's 429s.
"""

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.budget.buckets import RedisLimiter
from quotaflow.config import Settings
from quotaflow.deployments.catalog import load_deployments
from quotaflow.dispatch.queues import CollectingDispatcher
from quotaflow.execution import BatchExecutor
from quotaflow.ingest import pipeline
from quotaflow.results.output import iter_output
from tests.harness.anthropic_cluster import SCENARIOS, AnthropicCluster, Scenario
from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import REDIS_URL, service_env

KEY_ENV = "QF_TEST_ANTHROPIC_KEY"
BY_NAME = {scenario.name: scenario for scenario in SCENARIOS}


@pytest.fixture
def messages_mock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A strict Messages API mock with room to spare, wanting an x-api-key."""
    monkeypatch.setenv(KEY_ENV, "sk-ant-test")
    port = free_port()
    proc = Proc("messages-mock", quotaflow(
        "mock-provider", "--port", str(port), "--rpm", "60000", "--tpm", "1", "--itpm",
        "10000000", "--otpm", "10000000", "--latency-ms", "5", "--api-key-env", KEY_ENV),
        service_env(**{KEY_ENV: "sk-ant-test"}), tmp_path)
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/healthz")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop()


def run_job(pg_sessions: sessionmaker[Session], pg_url: str, redis_url: str, tmp_path: Path,
            base_url: str, lines: list[dict[str, Any]], output_format: str | None = None,
            max_attempts: int | None = None) -> tuple[list[dict], list[dict]]:
    """The lines as one job on an anthropic deployment; its output and error lines."""
    deployments = tmp_path / "deployments.toml"
    deployments.write_text(
        f'[deployments.claude]\nprovider = "anthropic"\nbase_url = "{base_url}"\n'
        f'model = "claude-test"\napi_key_env = "{KEY_ENV}"\nrpm = 60000\nitpm = 10000000\n'
        'otpm = 10000000\ncircuit_failures = 50\n[routes]\n"*" = "claude"\n')
    settings = Settings(database_url=pg_url, broker_url=redis_url, deployments_file=deployments,
                        batch_size=5, _env_file=None)
    loaded = load_deployments(deployments)
    dispatcher = CollectingDispatcher()
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    job = pipeline.create_job_in_process(
        pg_sessions, io.BytesIO(data), settings=settings, deployments=loaded, dispatcher=dispatcher,
        queue="realtime", output_format=output_format, max_attempts=max_attempts)
    executor = BatchExecutor(pg_sessions, loaded, RedisLimiter(redis_url), settings, defer=False)
    for ref in dispatcher.batches:
        executor.run(ref)
    with pg_sessions() as session:
        output = [json.loads(line) for line in iter_output(session, job.id, errors=False)]
        errors = [json.loads(line) for line in iter_output(session, job.id, errors=True)]
    return output, errors


def openai_line(i: int, **body: Any) -> dict[str, Any]:
    return {"custom_id": f"o{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "claude", "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": f"question {i}"}], **body}}


def anthropic_line(i: int, **params: Any) -> dict[str, Any]:
    return {"custom_id": f"a{i}", "params": {
        "model": "claude", "max_tokens": 40, "system": "be brief",
        "messages": [{"role": "user", "content": [{"type": "text", "text": f"question {i}"}]}],
        **params}}


def test_openai_lines_get_openai_output_lines(pg_sessions, pg_url, redis_url, tmp_path,
                                              messages_mock) -> None:
    output, errors = run_job(pg_sessions, pg_url, redis_url, tmp_path, messages_mock,
                             [openai_line(i, max_tokens=3) for i in range(3)]
                             + [openai_line(3)])
    assert errors == [] and [line["custom_id"] for line in output] == ["o0", "o1", "o2", "o3"]
    first, last = output[0]["response"], output[3]["response"]
    assert first["status_code"] == 200 and first["request_id"].startswith("req_")
    body = first["body"]
    assert body["object"] == "chat.completion" and body["id"].startswith("msg_")
    # max_tokens 3 cut the reply: Anthropic's max_tokens stop is OpenAI's length.
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["choices"][0]["message"]["content"] == "simulated reply to: question 0"[:12]
    assert body["usage"]["completion_tokens"] == 3 and body["usage"]["prompt_tokens"] > 0
    # No max_tokens: the deployment's default_max_tokens, required by Anthropic, was sent.
    assert last["body"]["choices"][0]["finish_reason"] == "stop"
    assert last["body"]["choices"][0]["message"]["content"] == "simulated reply to: question 3"


def test_anthropic_lines_get_message_batches_results(pg_sessions, pg_url, redis_url, tmp_path,
                                                     messages_mock) -> None:
    output, errors = run_job(pg_sessions, pg_url, redis_url, tmp_path, messages_mock,
                             [anthropic_line(i) for i in range(3)])
    assert errors == [] and [line["custom_id"] for line in output] == ["a0", "a1", "a2"]
    for i, line in enumerate(output):
        assert set(line) == {"custom_id", "result"}
        assert line["result"]["type"] == "succeeded"
        message = line["result"]["message"]
        assert message["type"] == "message" and message["stop_reason"] == "end_turn"
        assert message["content"] == [{"type": "text", "text": f"simulated reply to: question {i}"}]
        assert message["model"] == "claude-test"  # the deployment's model was sent
        assert message["usage"]["input_tokens"] > 0


def test_either_format_can_be_asked_for_the_other(pg_sessions, pg_url, redis_url, tmp_path,
                                                  messages_mock) -> None:
    as_openai, _ = run_job(pg_sessions, pg_url, redis_url, tmp_path, messages_mock,
                           [anthropic_line(0)], output_format="openai")
    body = as_openai[0]["response"]["body"]
    assert as_openai[0]["custom_id"] == "a0" and body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"] == "simulated reply to: question 0"
    as_anthropic, _ = run_job(pg_sessions, pg_url, redis_url, tmp_path, messages_mock,
                              [openai_line(0)], output_format="anthropic")
    assert as_anthropic[0]["result"]["message"]["content"][0]["text"] == (
        "simulated reply to: question 0")


def test_a_400_is_a_permanent_failure_line(pg_sessions, pg_url, redis_url, tmp_path,
                                           messages_mock) -> None:
    # The Messages API refuses fields it does not know: sent as written, this line gets a 400.
    output, errors = run_job(pg_sessions, pg_url, redis_url, tmp_path, messages_mock,
                             [anthropic_line(0), anthropic_line(1, frequency_penalty=0.5)])
    assert [line["custom_id"] for line in output] == ["a0"]
    [failed] = errors
    assert failed == {"custom_id": "a1", "result": {"type": "errored", "error": {
        "type": "error", "error": {"type": "invalid_request_error",
                                   "message": "frequency_penalty: Extra inputs are not "
                                              "permitted"}}}}
    stats = httpx.get(f"{messages_mock}/stats").json()
    assert stats["requests_total"] == 2  # not retried


def test_overloaded_and_rate_limited_answers_are_retried(pg_sessions, pg_url, redis_url,
                                                         tmp_path, messages_mock) -> None:
    httpx.put(f"{messages_mock}/faults", json={"529": 0.25, "429": 0.15}).raise_for_status()
    output, errors = run_job(pg_sessions, pg_url, redis_url, tmp_path, messages_mock,
                             [openai_line(i) for i in range(20)], max_attempts=10)
    assert errors == [] and len(output) == 20
    faults = httpx.get(f"{messages_mock}/stats").json()["faults"]
    assert faults.get("529", 0) > 0 and faults.get("429", 0) > 0, faults


@pytest.fixture(scope="module")
def cluster(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AnthropicCluster]:
    with AnthropicCluster(pg_url, REDIS_URL, tmp_path_factory.mktemp("anthropic")) as started:
        yield started


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if not s.naive],
                         ids=lambda s: s.name)
def test_each_limit_binds_in_turn_with_zero_429s(cluster: AnthropicCluster,
                                                 scenario: Scenario) -> None:
    outcome = cluster.run(scenario)
    assert outcome.status == "completed" and outcome.completed == outcome.items
    assert outcome.rejected_429 == 0, outcome
    assert outcome.duplicate_bodies == 0
    assert outcome.binding == scenario.name.removeprefix("binds-").replace(
        "rpm", "requests").replace("itpm", "input-tokens").replace("otpm", "output-tokens")
    assert outcome.utilisation >= 0.85, (outcome, outcome.shares())


def test_a_limiter_that_ignores_itpm_and_otpm_meets_429s(cluster: AnthropicCluster) -> None:
    # The same job as binds-itpm on a deployment that counts input and output together
    # against tpm = itpm + otpm: the provider refuses what its input bucket cannot take.
    outcome = cluster.run(BY_NAME["naive-itpm"])
    assert outcome.rejected_429 > 0, outcome
    assert outcome.limited_by.get("input-tokens", 0) > 0, outcome

"""The mock provider is the judge of the limiter tests, so it is tested served for real.

Server tests start `uvicorn mock_provider:app_from_env --factory` in a
subprocess, configured by QUOTAFLOW_MOCK_* variables, and talk HTTP to it; the
CLI builds the same app from the same settings object (tested below). Bucket and
header arithmetic is tested in-process with an injectable clock.
"""

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mock_provider import LeanProvider, MockProviderSettings, app_from_env, create_app
from mock_provider.buckets import RateLimits, TokenBucket
from mock_provider.wire import format_reset
from quotaflow.budget.tokens import admission_tokens
from quotaflow.errors import ConfigError
from tests.harness.servers import ROOT

pytestmark = pytest.mark.timeout(30)

CHAT = "/v1/chat/completions"
STARTUP_TIMEOUT_S = 15.0
KEY_VAR = "QUOTAFLOW_TEST_MOCK_KEY"

Serve = Callable[..., httpx.Client]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _server_env(settings: dict[str, Any]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUOTAFLOW_MOCK_")}
    api_key = settings.pop("api_key", None)
    if api_key is not None:
        env["QUOTAFLOW_MOCK_API_KEY_ENV"] = KEY_VAR
        env[KEY_VAR] = api_key
    for name, value in settings.items():
        env[f"QUOTAFLOW_MOCK_{name.upper()}"] = str(value)
    return env


def _wait_healthy(proc: subprocess.Popen[bytes], base_url: str, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"mock provider exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{base_url}/healthz", timeout=0.5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    pytest.fail(f"mock provider not healthy after {STARTUP_TIMEOUT_S}s:\n{log.read_text()}")


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    """Start a mock provider with QUOTAFLOW_MOCK_* settings; stop it (only it) afterwards."""
    started: list[tuple[subprocess.Popen[bytes], httpx.Client]] = []

    def start(**settings: Any) -> httpx.Client:
        port = _free_port()
        log = tmp_path / f"mock-{port}.log"
        command = [
            sys.executable,
            "-m",
            "uvicorn",
            "mock_provider:app_from_env",
            "--factory",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                command,
                cwd=ROOT,
                env=_server_env(settings),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5.0)
        started.append((proc, client))
        _wait_healthy(proc, str(client.base_url).rstrip("/"), log)
        return client

    yield start
    for proc, client in started:
        client.close()
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def chat(prompt: str, max_tokens: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": prompt}],
    }
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


def reset_ms(value: str) -> float:
    """Milliseconds in a short OpenAI reset duration such as "480ms" or "1.2s"."""
    match = re.fullmatch(r"(\d+)ms|(\d+(?:\.\d+)?)s", value)
    assert match, value
    return float(match[1]) if match[1] else float(match[2]) * 1000


# --- served for real ---------------------------------------------------------------------------


def test_burst_beyond_request_capacity_is_refused_until_retry_after(serve: Serve) -> None:
    # Given 120 RPM with a 1 s burst: 2 requests fit, refilling one every 0.5 s
    client = serve(rpm=120, tpm=1_000_000, burst_seconds=1)

    # When four requests arrive at once
    answers = [client.post(CHAT, json=chat(f"burst {i}")) for i in range(4)]

    # Then the first two pass and the rest get OpenAI's 429
    assert [a.status_code for a in answers] == [200, 200, 429, 429]
    refused = answers[2]
    error = refused.json()["error"]
    assert error["type"] == "requests"
    assert error["code"] == "rate_limit_exceeded"
    assert error["param"] is None
    assert error["message"].startswith("Rate limit reached for requests")
    headers = refused.headers
    assert headers["retry-after"] == "1"
    assert 0 < int(headers["retry-after-ms"]) <= 500
    assert headers["x-ratelimit-limit-requests"] == "120"
    assert headers["x-ratelimit-limit-tokens"] == "1000000"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert 0 < reset_ms(headers["x-ratelimit-reset-requests"]) <= 1000
    assert re.fullmatch(r"req_[0-9a-f]+", headers["x-request-id"])

    # When the client waits retry-after-ms, then retry-after: each retry passes
    time.sleep(int(answers[3].headers["retry-after-ms"]) / 1000 + 0.02)
    assert client.post(CHAT, json=chat("after ms")).status_code == 200
    again = client.post(CHAT, json=chat("too soon"))
    assert again.status_code == 429
    time.sleep(int(again.headers["retry-after"]))
    assert client.post(CHAT, json=chat("after s")).status_code == 200


def test_token_bucket_limits_by_admission_cost(serve: Serve) -> None:
    # Given 600 TPM with a 2 s burst: 20 tokens, refilling 10 a second; requests plentiful;
    # admission cost is final (no refund of unused max_tokens)
    client = serve(rpm=60_000, tpm=600, burst_seconds=2, reconcile=0)
    big = chat("hi", max_tokens=15)
    assert admission_tokens(CHAT, big, 256) == 16

    # When a 16-token request is followed by another
    first = client.post(CHAT, json=big)
    second = client.post(CHAT, json=big)

    # Then the second is refused on tokens, though requests are left
    assert first.status_code == 200
    assert first.headers["x-ratelimit-remaining-tokens"] == "4"
    assert second.status_code == 429
    assert second.json()["error"]["type"] == "tokens"
    assert int(second.headers["x-ratelimit-remaining-requests"]) > 900
    assert 1000 < int(second.headers["retry-after-ms"]) <= 1200
    assert second.headers["retry-after"] == "2"

    # And a cheap request still fits in what is left: admission is by cost
    assert client.post(CHAT, json=chat("hi", max_tokens=2)).status_code == 200
    # And one larger than the whole bucket is refused: it can never fit
    huge = client.post(CHAT, json=chat("hi", max_tokens=100))
    assert huge.status_code == 429
    assert huge.json()["error"]["message"].startswith("Request too large for tokens")
    # The default max_tokens (256) counts too when the body sets none
    assert client.post(CHAT, json=chat("hi")).status_code == 429
    assert client.get("/stats").json()["tokens_admitted"] == 16 + 3


def test_reconcile_refunds_unused_max_tokens_after_the_answer(serve: Serve) -> None:
    # Given 20 tokens of burst and a request admitted at 16 that really uses 7
    client = serve(rpm=60_000, tpm=600, burst_seconds=2)
    answer = client.post(CHAT, json=chat("hi", max_tokens=15))
    assert answer.status_code == 200
    assert answer.json()["usage"]["total_tokens"] == 7
    # Then the 9 unused tokens are back in the bucket, and the headers say so
    assert answer.headers["x-ratelimit-remaining-tokens"] == "13"
    assert client.get("/stats").json()["tokens_refunded"] == 9


def test_answers_are_openai_shaped_and_simulated(serve: Serve) -> None:
    client = serve(rpm=600, tpm=100_000, latency_ms=50)
    body = {
        "model": "gpt-4o-mini",
        "max_tokens": 64,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 2+2?"},
        ],
    }

    started = time.monotonic()
    answer = client.post(CHAT, json=body)
    elapsed = time.monotonic() - started

    assert answer.status_code == 200
    assert elapsed >= 0.05  # latency_ms is served after admission
    data = answer.json()
    assert data["object"] == "chat.completion"
    assert data["model"] == "gpt-4o-mini"
    assert data["system_fingerprint"] == "quotaflow-simulated"
    choice = data["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "simulated reply to: What is 2+2?"}
    assert choice["finish_reason"] == "stop"
    usage = data["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert re.fullmatch(r"req_[0-9a-f]+", answer.headers["x-request-id"])
    assert answer.headers["x-ratelimit-limit-requests"] == "600"
    assert answer.headers["x-ratelimit-remaining-requests"] == "599"

    completion = client.post("/v1/completions", json={"model": "m", "prompt": "Say hi"}).json()
    assert completion["choices"][0]["text"] == "simulated reply to: Say hi"
    embedding = client.post("/v1/embeddings", json={"model": "e", "input": "Say hi"}).json()
    assert embedding["object"] == "list" and embedding["data"][0]["embedding"]


def test_responses_and_moderations_are_admitted_as_quotaflow_counts_them(serve: Serve) -> None:
    # Given a strict provider that refunds unused tokens, and its default max_tokens of 100
    client = serve(rpm=600, tpm=100_000, default_max_tokens=100)
    response_body = {"model": "gpt-4.1", "instructions": "Be brief.", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "What is 2+2?"},
                                     {"type": "input_image", "image_url": "https://x/y.png",
                                      "detail": "low"}]}]}
    moderation_body = {"model": "omni-moderation-latest", "input": ["fine", "hate speech"]}
    # When a Response and a moderation are asked for
    response = client.post("/v1/responses", json=response_body)
    moderation = client.post("/v1/moderations", json=moderation_body)
    # Then each is OpenAI's object, and each was admitted at quotaflow's own count: the
    # response at its text, image (85, low) and the default ceiling; the moderation at
    # its input alone
    assert response.status_code == moderation.status_code == 200
    answer = response.json()
    assert answer["object"] == "response" and answer["output"][0]["content"][0]["text"] == (
        "simulated reply to: What is 2+2?")
    assert moderation.json()["id"].startswith("modr-")
    assert [r["flagged"] for r in moderation.json()["results"]] == [False, True]
    cost = admission_tokens("/v1/responses", response_body, 100)
    assert cost == (len("Be brief.\nWhat is 2+2?") + 3) // 4 + 85 + 100
    stats = client.get("/stats").json()
    assert stats["tokens_admitted"] == cost + admission_tokens("/v1/moderations",
                                                               moderation_body, 100)
    # And the response's unused ceiling came back (a moderation has no usage to settle)
    assert stats["tokens_refunded"] == cost - answer["usage"]["total_tokens"]
    assert stats["prompt_tokens"] == answer["usage"]["input_tokens"]
    assert stats["completion_tokens"] == answer["usage"]["output_tokens"]


def test_stats_count_admissions_refusals_and_duplicate_bodies(serve: Serve) -> None:
    # Given room for 3 requests (180 RPM, 1 s burst)
    client = serve(rpm=180, tpm=1_000_000, burst_seconds=1)
    same, other = chat("same"), chat("other")

    # When the same body is sent twice, another once, then the first again
    answers = [client.post(CHAT, json=b) for b in (same, same, other, same)]

    # Then three are admitted, one refused, and one admission was a repeat
    assert [a.status_code for a in answers] == [200, 200, 200, 429]
    stats = client.get("/stats").json()
    usages = [a.json()["usage"] for a in answers[:3]]
    assert stats["requests_total"] == 4
    assert stats["admitted"] == 3
    assert stats["rejected_429"] == 1
    assert stats["duplicate_bodies"] == 1
    assert stats["max_calls_per_body"] == 2
    assert stats["tokens_admitted"] == sum(
        admission_tokens(CHAT, b, 256) for b in (same, same, other)
    )
    assert stats["prompt_tokens"] == sum(u["prompt_tokens"] for u in usages)
    assert stats["completion_tokens"] == sum(u["completion_tokens"] for u in usages)
    assert 0 < stats["first_admitted_at"] <= stats["last_admitted_at"] <= time.time()

    # When the accounting is reset, the buckets are not
    zero = client.post("/stats/reset").json()
    assert zero["admitted"] == zero["duplicate_bodies"] == zero["max_calls_per_body"] == 0
    assert zero["first_admitted_at"] is None and zero["last_admitted_at"] is None
    assert client.post(CHAT, json=same).status_code == 429
    time.sleep(0.4)
    assert client.post(CHAT, json=same).status_code == 200
    stats = client.get("/stats").json()
    assert (stats["admitted"], stats["rejected_429"], stats["duplicate_bodies"]) == (1, 1, 0)


def test_bad_json_is_400_and_spends_nothing(serve: Serve) -> None:
    client = serve(rpm=60, tpm=1_000, burst_seconds=1)
    headers = {"content-type": "application/json"}

    for content in (b"{not json", b"[1, 2]", b'{"messages": ["not a dict"]}'):
        answer = client.post(CHAT, content=content, headers=headers)
        assert answer.status_code == 400, content
        assert answer.json()["error"]["type"] == "invalid_request_error"

    # The one request the bucket holds is still there
    assert client.post(CHAT, json=chat("fine", max_tokens=5)).status_code == 200
    stats = client.get("/stats").json()
    assert (stats["requests_total"], stats["admitted"], stats["rejected_429"]) == (4, 1, 0)


def test_api_key_is_required_when_configured(serve: Serve) -> None:
    client = serve(rpm=600, tpm=100_000, api_key="sk-test-secret")

    missing = client.post(CHAT, json=chat("hi"))
    wrong = client.post(CHAT, json=chat("hi"), headers={"Authorization": "Bearer sk-nope"})
    right = client.post(CHAT, json=chat("hi"), headers={"Authorization": "Bearer sk-test-secret"})

    assert missing.status_code == wrong.status_code == 401
    assert missing.json()["error"]["code"] == "invalid_api_key"
    assert "sk-test-secret" not in missing.text + wrong.text
    assert right.status_code == 200
    assert client.get("/healthz").json() == {"status": "ok"}


# --- unlimited mode: the lean provider of the throughput benchmark ------------------------------


def _without_ids(answer: dict[str, Any]) -> dict[str, Any]:
    kept = {k: v for k, v in answer.items() if k not in ("id", "created", "created_at")}
    if "output" in kept:  # a Response's output items have ids of their own
        kept["output"] = [{k: v for k, v in item.items() if k != "id"} for item in kept["output"]]
    return kept


def test_unlimited_mode_admits_everything_with_the_same_simulated_answers(serve: Serve) -> None:
    # Given the unlimited server: no RPM/TPM at all, and a strict one to compare with
    lean = serve(unlimited=1)
    strict = serve(rpm=60_000, tpm=10_000_000)
    bodies = {CHAT: chat("What is 2+2?", max_tokens=4),
              "/v1/completions": {"model": "m", "prompt": "Say hi"},
              "/v1/embeddings": {"model": "e", "input": "Say hi"},
              "/v1/responses": {"model": "r", "input": "Say hi"},
              "/v1/moderations": {"model": "o", "input": "Say hi"}}

    # When each endpoint is called, and one chat body three times more
    answers = {url: lean.post(url, json=body) for url, body in bodies.items()}
    repeats = [lean.post(CHAT, json=bodies[CHAT]) for _ in range(3)]

    # Then the answers are the strict server's simulated bodies, without rate-limit headers
    for url, answer in answers.items():
        assert answer.status_code == 200
        expected = strict.post(url, json=bodies[url]).json()
        assert _without_ids(answer.json()) == _without_ids(expected)
        assert not [h for h in answer.headers if h.startswith("x-ratelimit")]
        assert re.fullmatch(r"req_[0-9a-f]+", answer.headers["x-request-id"])
    assert answers[CHAT].json()["system_fingerprint"] == "quotaflow-simulated"
    assert all(r.status_code == 200 for r in repeats)
    # And /stats counts requests, usage and repeated bodies as the strict judge's does
    stats = lean.get("/stats").json()
    usages = [a.json().get("usage", {}) for a in [*answers.values(), *repeats]]
    assert stats["unlimited"] is True
    assert (stats["requests_total"], stats["admitted"], stats["rejected_429"]) == (8, 8, 0)
    assert (stats["duplicate_bodies"], stats["max_calls_per_body"]) == (3, 4)
    assert stats["prompt_tokens"] == sum(u.get("prompt_tokens") or u.get("input_tokens", 0)
                                         for u in usages)
    assert stats["completion_tokens"] == sum(u.get("completion_tokens")
                                             or u.get("output_tokens", 0) for u in usages)
    assert 0 < stats["first_admitted_at"] <= stats["last_admitted_at"] <= time.time()

    # And bad bodies are 400s, unknown routes 404s, and a reset zeroes the counts
    for content in (b"{not json", b"[1, 2]", b'{"messages": ["not a dict"]}'):
        bad = lean.post(CHAT, content=content, headers={"content-type": "application/json"})
        assert bad.status_code == 400, content
        assert bad.json()["error"]["type"] == "invalid_request_error"
    assert lean.get(CHAT).status_code == lean.post("/v1/nothing", json={}).status_code == 404
    assert lean.post("/stats/reset").json()["admitted"] == 0
    assert lean.get("/healthz").json() == {"status": "ok"}


def test_unlimited_mode_served_by_the_cli_and_checks_the_key(tmp_path: Path) -> None:
    # Given `quotaflow mock-provider --unlimited` with a key, as bench/e2e.py starts it
    port = _free_port()
    log = tmp_path / "lean.log"
    env = _server_env({"api_key": "sk-lean"})
    command = [sys.executable, "-c", "from cli.main import main; main()", "mock-provider",
               "--unlimited", "--latency-ms", "0", "--port", str(port),
               "--api-key-env", KEY_VAR]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        _wait_healthy(proc, f"http://127.0.0.1:{port}", log)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5.0) as client:
            # Then it answers with the key only, and many requests in a row are all admitted
            assert client.post(CHAT, json=chat("hi")).status_code == 401
            auth = {"Authorization": "Bearer sk-lean"}
            codes = {client.post(CHAT, json=chat(f"n{i}"), headers=auth).status_code
                     for i in range(200)}
            assert codes == {200}
            stats = client.get("/stats").json()
            assert (stats["requests_total"], stats["admitted"]) == (201, 200)
            assert stats["duplicate_bodies"] == 0
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_unlimited_mode_refuses_faults() -> None:
    from click.testing import CliRunner

    from cli.main import cli

    result = CliRunner().invoke(cli, ["mock-provider", "--unlimited", "--fault", "500=0.1"])
    assert isinstance(result.exception, ConfigError)
    assert "--fault needs the strict provider" in str(result.exception)


# --- in process: buckets, headers, configuration -----------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_bucket_refills_continuously_up_to_capacity() -> None:
    bucket = TokenBucket(limit_per_minute=60, burst_seconds=10, now=0.0)
    assert (bucket.capacity, bucket.rate) == (10, 1)

    bucket.take(10, now=0.0)
    assert bucket.level(now=2.5) == 2.5
    assert bucket.wait_for(5, now=2.5) == 2.5
    assert bucket.wait_for(2, now=2.5) == 0
    assert bucket.until_full(now=2.5) == 7.5
    assert bucket.level(now=100.0) == 10
    assert bucket.wait_for(11, now=100.0) == float("inf")


def test_rate_limits_admit_all_or_nothing() -> None:
    # Given 2 requests and 10 tokens of burst, refilling 2 requests and 10 tokens a second
    clock = FakeClock()
    limits = RateLimits(rpm=120, tpm=600, burst_seconds=1, clock=clock)

    assert limits.try_admit(8).admitted
    # Tokens short: refused, and the request it would have used stays
    refused = limits.try_admit(8)
    assert (refused.admitted, refused.limited_by) == (False, "tokens")
    assert refused.wait_s == pytest.approx(0.6)
    assert refused.remaining_requests == 1 and refused.remaining_tokens == 2
    assert limits.try_admit(2).admitted
    # Requests short: refused, and the tokens stay
    refused = limits.try_admit(0)
    assert (refused.admitted, refused.limited_by) == (False, "requests")
    assert refused.wait_s == pytest.approx(0.5)
    assert refused.remaining_tokens == 0

    clock.now += 0.5
    admitted = limits.try_admit(5)
    assert admitted.admitted
    assert admitted.remaining_requests == 0 and admitted.remaining_tokens == 0
    assert admitted.reset_requests_s == pytest.approx(1.0)

    never = limits.try_admit(11)
    assert not never.admitted and never.never_fits and never.limited_by == "tokens"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.0004, "1ms"),
        (0.12, "120ms"),
        (1, "1s"),
        (1.5, "1.5s"),
        (59.241, "59.241s"),
        (360, "6m0s"),
        (90.5, "1m30.5s"),
        (3725, "1h2m5s"),
    ],
)
def test_reset_headers_read_like_openai(seconds: float, text: str) -> None:
    assert format_reset(seconds) == text


@pytest.mark.parametrize(
    "settings",
    [
        {"rpm": 0, "tpm": 10},
        {"rpm": 10, "tpm": -1},
        {"rpm": 10, "tpm": 10, "burst_seconds": 0},
        {"rpm": 30, "tpm": 10, "burst_seconds": 1},
    ],  # holds half a request: nothing could pass
)
def test_create_app_refuses_unusable_limits(settings: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="mock provider"):
        create_app(**settings)


def test_app_from_env_explains_missing_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QUOTAFLOW_MOCK_RPM", raising=False)
    monkeypatch.setenv("QUOTAFLOW_MOCK_TPM", "1000")
    with pytest.raises(ConfigError, match="QUOTAFLOW_MOCK_RPM is not set"):
        app_from_env()

    monkeypatch.setenv("QUOTAFLOW_MOCK_RPM", "sixty")
    with pytest.raises(ConfigError, match="whole number"):
        app_from_env()

    monkeypatch.setenv("QUOTAFLOW_MOCK_RPM", "60")
    monkeypatch.setenv("QUOTAFLOW_MOCK_API_KEY_ENV", KEY_VAR)
    monkeypatch.delenv(KEY_VAR, raising=False)
    with pytest.raises(ConfigError, match=KEY_VAR):
        app_from_env()


def _without_mock_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in os.environ:
        if name.startswith("QUOTAFLOW_MOCK_"):
            monkeypatch.delenv(name)


def test_settings_read_the_quotaflow_mock_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given no QUOTAFLOW_MOCK_* at all: the defaults of the environment-configured server
    _without_mock_env(monkeypatch)
    defaults = MockProviderSettings()
    assert (defaults.unlimited, defaults.rpm, defaults.tpm) == (False, None, None)
    assert (defaults.latency_ms, defaults.burst_seconds, defaults.default_max_tokens) == (
        0.0, 60.0, 256)
    assert (defaults.api_key_env, defaults.reconcile) == (None, True)
    assert set(defaults.fault_fractions().values()) == {0.0}

    # When every variable is set (an empty one counts as unset)
    monkeypatch.setenv("QUOTAFLOW_MOCK_UNLIMITED", "1")
    monkeypatch.setenv("QUOTAFLOW_MOCK_RPM", " 120 ")
    monkeypatch.setenv("QUOTAFLOW_MOCK_TPM", "9000")
    monkeypatch.setenv("QUOTAFLOW_MOCK_LATENCY_MS", "2.5")
    monkeypatch.setenv("QUOTAFLOW_MOCK_BURST_SECONDS", "")
    monkeypatch.setenv("QUOTAFLOW_MOCK_DEFAULT_MAX_TOKENS", "64")
    monkeypatch.setenv("QUOTAFLOW_MOCK_API_KEY_ENV", KEY_VAR)
    monkeypatch.setenv("QUOTAFLOW_MOCK_RECONCILE", "0")
    monkeypatch.setenv("QUOTAFLOW_MOCK_FAULT_RESET", "0.25")
    settings = MockProviderSettings.load()

    # Then each is read into its field
    assert (settings.unlimited, settings.rpm, settings.tpm) == (True, 120, 9000)
    assert (settings.latency_ms, settings.burst_seconds, settings.default_max_tokens) == (
        2.5, 60.0, 64)
    assert (settings.api_key_env, settings.reconcile) == (KEY_VAR, False)
    assert settings.fault_fractions()["reset"] == 0.25


Served = tuple[Any, dict[str, Any]]


def _cli_serves(monkeypatch: pytest.MonkeyPatch, *options: str) -> Served:
    """What `quotaflow mock-provider OPTIONS` hands uvicorn, with uvicorn not started."""
    import uvicorn
    from click.testing import CliRunner

    from cli.main import cli

    served: list[Served] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kwargs: served.append((app, kwargs)))
    before = dict(os.environ)
    result = CliRunner().invoke(cli, ["mock-provider", *options], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert dict(os.environ) == before  # options reach the app as settings, not variables
    assert len(served) == 1
    return served[0]


def test_cli_builds_the_app_from_its_options(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_mock_env(monkeypatch)
    monkeypatch.setenv(KEY_VAR, "sk-cli")
    # A fault the options leave out still comes from its variable, as it always did
    monkeypatch.setenv("QUOTAFLOW_MOCK_FAULT_HANG", "0.125")

    app, kwargs = _cli_serves(
        monkeypatch, "--port", "9123", "--rpm", "120", "--tpm", "5000", "--latency-ms", "7",
        "--burst-seconds", "1", "--default-max-tokens", "32", "--no-reconcile",
        "--fault", "500=0.25", "--api-key-env", KEY_VAR)

    assert kwargs == {"host": "127.0.0.1", "port": 9123, "log_level": "warning"}
    judge = app.state.judge
    assert (judge.rpm, judge.tpm, judge.latency_s, judge.default_max_tokens) == (
        120, 5000, 0.007, 32)
    assert judge.limits.requests.capacity == 2 and not judge.reconcile
    assert (judge.faults.error_500, judge.faults.hang) == (0.25, 0.125)
    assert judge._api_key == "sk-cli"


def test_cli_unlimited_serves_the_lean_app_without_access_log(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _without_mock_env(monkeypatch)
    app, kwargs = _cli_serves(monkeypatch, "--unlimited", "--latency-ms", "0")
    assert isinstance(app, LeanProvider) and app.latency_s == 0
    assert kwargs == {"host": "127.0.0.1", "port": 9000, "log_level": "warning",
                      "access_log": False}


@pytest.mark.parametrize("fault", ["500", "500=", "500=lots", "slow=0.1"])
def test_cli_refuses_a_malformed_fault(fault: str) -> None:
    from click.testing import CliRunner

    from cli.main import cli

    result = CliRunner().invoke(cli, ["mock-provider", "--fault", fault])
    assert isinstance(result.exception, ConfigError)
    assert "use KIND=FRACTION" in str(result.exception)

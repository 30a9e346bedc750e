"""The strict mock's Anthropic Messages API: RPM, ITPM and OTPM enforced apart, in
Anthropic's error shape, with its anthropic-ratelimit-* headers and /stats counts."""

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mock_provider.messages import SplitLimits, invalid, prompt_of
from quotaflow.budget.tokens import estimate_tokens
from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import service_env


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_each_of_the_three_buckets_refuses_alone_and_says_which() -> None:
    clock = Clock()
    limits = SplitLimits(rpm=60, itpm=600, otpm=120, burst_seconds=60, clock=clock)
    assert limits.try_admit(500, 100).admitted
    refused = limits.try_admit(200, 10)
    assert not refused.admitted and refused.limited_by == "input-tokens"
    assert refused.wait_s == pytest.approx(10.0)  # 100 short at 10 a second
    refused = limits.try_admit(10, 50)
    assert not refused.admitted and refused.limited_by == "output-tokens"
    limits.refund_output(60)  # the answer used 40 of its 100
    assert limits.try_admit(10, 50).admitted
    clock.now = 60
    assert [limits.try_admit(1, 1).admitted for _ in range(61)].count(True) == 60


def test_what_the_real_api_refuses_with_a_400() -> None:
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    assert invalid(body) is None
    assert "Extra inputs" in invalid({**body, "n": 2})
    assert "max_tokens" in invalid({k: v for k, v in body.items() if k != "max_tokens"})
    assert "messages" in invalid({**body, "messages": [{"role": "system", "content": "x"}]})
    assert prompt_of({**body, "system": [{"type": "text", "text": "be"}]}) == "be\nhi"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    proc = Proc("messages-mock", quotaflow(
        "mock-provider", "--port", str(port), "--rpm", "600", "--tpm", "1", "--itpm", "120",
        "--otpm", "600", "--burst-seconds", "60", "--latency-ms", "0", "--api-key-env",
        "QF_TEST_MOCK_KEY"), service_env(QF_TEST_MOCK_KEY="k"), tmp_path)
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/healthz")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop()


def post(base: str, content: str, max_tokens: int = 10, key: str = "k") -> httpx.Response:
    return httpx.post(f"{base}/v1/messages", headers={"x-api-key": key}, json={
        "model": "claude", "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": content}]})


def test_served_messages_limits_headers_and_stats(served: str) -> None:
    assert post(served, "hi", key="wrong").json()["error"]["type"] == "authentication_error"
    answer = post(served, "x" * 200)  # 50 input tokens of the 120
    assert answer.status_code == 200
    message = answer.json()
    assert message["type"] == "message" and message["usage"]["input_tokens"] == 50
    assert message["content"][0]["text"].startswith("simulated reply to: xxx")
    assert message["stop_reason"] == "max_tokens"  # cut at 10 tokens
    headers = answer.headers
    assert headers["anthropic-ratelimit-input-tokens-limit"] == "120"
    assert headers["anthropic-ratelimit-input-tokens-remaining"] == "70"
    assert headers["anthropic-ratelimit-output-tokens-remaining"] == "590"  # all 10 used
    assert headers["anthropic-ratelimit-requests-remaining"] == "599"
    assert headers["anthropic-ratelimit-input-tokens-reset"].endswith("Z")
    assert post(served, "x" * 200).status_code == 200
    refused = post(served, "x" * 200)  # 20 left: over ITPM
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    assert refused.json() == {"type": "error", "error": {
        "type": "rate_limit_error", "message": refused.json()["error"]["message"]}}
    assert "input-tokens" in refused.json()["error"]["message"]
    bad = httpx.post(f"{served}/v1/messages", headers={"x-api-key": "k"},
                     json={"model": "claude", "messages": [{"role": "user", "content": "x"}]})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    httpx.put(f"{served}/faults", json={"529": 1.0}).raise_for_status()
    overloaded = post(served, "hi")
    assert overloaded.status_code == 529
    assert overloaded.json()["error"]["type"] == "overloaded_error"
    stats = httpx.get(f"{served}/stats").json()
    assert stats["admitted"] == 2 and stats["rejected_429"] == 1
    assert stats["limited_by"] == {"input-tokens": 1}
    assert stats["input_tokens_admitted"] == 2 * estimate_tokens("x" * 200)
    assert stats["output_tokens_admitted"] == 20 and stats["faults"]["529"] == 1

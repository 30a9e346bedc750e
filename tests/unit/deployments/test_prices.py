"""Prices that match the bills: cache reads and writes at their own prices and long-context
tiers, from each provider's usage shape to the charge, in the estimate's range, and the
deployments file's checks. The ledger and the spend limit on a real cluster:
tests/cluster/test_cache_prices.py."""

import io
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from quotaflow.config import Settings
from quotaflow.deployments.catalog import load_deployments
from quotaflow.deployments.deployment import Deployment
from quotaflow.deployments.pricing import Prices, TokenTally, cost_range
from quotaflow.ingest.estimate import scan_file
from quotaflow.offload.results import read_line
from quotaflow.providers.anthropic import AnthropicProvider
from quotaflow.providers.base import ProviderResponse
from quotaflow.providers.bedrock import BedrockProvider
from quotaflow.providers.gemini import GeminiProvider
from quotaflow.providers.openai_compat import OpenAICompatProvider
from quotaflow.tenants.spend import Charge

# Claude Sonnet's list prices: 3 in, 15 out, reads 0.30, 5-minute writes 3.75, 1-hour 6;
# over 200k prompt tokens 6 in, 22.50 out, reads 0.60, writes 7.50 and 12.
BASE = Prices(3.0, 15.0, 0.30, "USD", 3.75, 6.0)
SONNET = Prices(3.0, 15.0, 0.30, "USD", 3.75, 6.0,
                Prices(6.0, 22.5, 0.60, "USD", 7.5, 12.0), 200_000)
KEY_ENV = "QF_TEST_PRICES_KEY"
M = 1_000_000


@pytest.fixture(autouse=True)
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "k")


def billed(response: ProviderResponse, prices: Prices) -> float:
    """What the ledger adds for one answer: its Charge at the deployment's prices."""
    charge = Charge("d", response.prompt_tokens, response.completion_tokens,
                    response.cached_tokens, response.cache_write_tokens,
                    response.cache_write_1h_tokens)
    return prices.cost(charge.prompt_tokens, charge.completion_tokens, charge.cached_tokens,
                       charge.cache_write_tokens, charge.cache_write_1h_tokens)


def test_each_kind_of_prompt_token_is_billed_at_its_own_price() -> None:
    # 1M fresh input, 1M reads, 1M 5-minute writes, 1M 1-hour writes, 1M output
    assert BASE.cost(4 * M, M, M, 2 * M, M) == pytest.approx(3 + 0.30 + 3.75 + 6 + 15)
    # No 1-hour price: 1-hour writes at the write price; no write price: at the input's
    flat_hour = Prices(3.0, 15.0, cache_write_per_mtok=3.75)
    assert flat_hour.cost(2 * M, 0, 0, 2 * M, M) == pytest.approx(7.5)
    assert Prices(3.0, 15.0).cost(2 * M, 0, M, M) == pytest.approx(6.0)
    # More reads than prompt tokens (a provider's odd count) never bill below zero input
    assert Prices(1.0, 1.0, 0.5).cost(M, 0, 2 * M) == pytest.approx(0.5)


def test_a_prompt_over_the_threshold_prices_the_whole_request_at_its_tier() -> None:
    at, over = SONNET.cost(200_000, M), SONNET.cost(200_001, M)
    assert at == pytest.approx(0.6 + 15)
    assert over == pytest.approx(200_001 * 6 / M + 22.5)
    # the tier's cache prices too
    assert SONNET.cost(300_000, 0, 100_000, 100_000) == pytest.approx(
        (100_000 * 6 + 100_000 * 0.6 + 100_000 * 7.5) / M)


def test_anthropic_usage_bills_writes_reads_and_their_lifetimes() -> None:
    deployment = Deployment(name="a", provider="anthropic", base_url="http://127.0.0.1:9",
                            model="claude", api_key_env=KEY_ENV, rpm=60, tpm=1000)
    body = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude",
            "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 100, "output_tokens": 50,
                      "cache_creation_input_tokens": 3000, "cache_read_input_tokens": 2000,
                      "cache_creation": {"ephemeral_5m_input_tokens": 1000,
                                         "ephemeral_1h_input_tokens": 2000}}}
    answer = AnthropicProvider(deployment)._interpret(200, {}, "OK", json.dumps(body).encode())
    assert (answer.prompt_tokens, answer.cached_tokens, answer.cache_write_tokens,
            answer.cache_write_1h_tokens) == (5100, 2000, 3000, 2000)
    assert billed(answer, SONNET) == pytest.approx(
        (100 * 3 + 2000 * 0.30 + 1000 * 3.75 + 2000 * 6 + 50 * 15) / M)
    # The pricing this replaces billed the writes as input: under 70% of the bill here
    assert Prices(3.0, 15.0, 0.30).cost(5100, 50, 2000) < billed(answer, SONNET) * 0.7
    # An answer in a Message Batch's results is billed the same
    batch = read_line({"custom_id": "q1", "result": {"type": "succeeded",
                                                         "message": body}}, "anthropic-batch")
    assert batch is not None and isinstance(batch.outcome, ProviderResponse)
    assert billed(batch.outcome, SONNET) == pytest.approx(billed(answer, SONNET))


@pytest.mark.parametrize("api", ["converse", "invoke"])
def test_bedrock_usage_bills_cache_writes_and_reads(api: str) -> None:
    deployment = Deployment(name="b", provider="bedrock", model="anthropic.claude",
                            region="us-east-1", api_key_env=KEY_ENV, bedrock_api=api,
                            rpm=60, tpm=1000)
    if api == "converse":
        body: dict[str, Any] = {
            "output": {"message": {"role": "assistant", "content": [{"text": "ok"}]}},
            "stopReason": "end_turn",
            "usage": {"inputTokens": 100, "outputTokens": 50, "cacheReadInputTokens": 2000,
                      "cacheWriteInputTokens": 3000}}
    else:
        body = {"id": "msg_1", "type": "message", "role": "assistant", "content": [],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": 100, "output_tokens": 50,
                          "cache_read_input_tokens": 2000, "cache_creation_input_tokens": 3000}}
    answer = BedrockProvider(deployment)._interpret(200, {}, None, json.dumps(body).encode())
    assert (answer.prompt_tokens, answer.cached_tokens, answer.cache_write_tokens) == (
        5100, 2000, 3000)
    assert billed(answer, SONNET) == pytest.approx(
        (100 * 3 + 2000 * 0.30 + 3000 * 3.75 + 50 * 15) / M)


def test_openai_cached_tokens_are_billed_at_the_cache_read_price() -> None:
    deployment = Deployment(name="o", provider="openai", base_url="http://127.0.0.1:9/v1",
                            model="gpt", api_key_env=KEY_ENV, rpm=60, tpm=1000)
    body = {"id": "c", "object": "chat.completion", "choices": [],
            "usage": {"prompt_tokens": 3000, "completion_tokens": 50,
                      "prompt_tokens_details": {"cached_tokens": 2048}}}
    answer = OpenAICompatProvider(deployment)._interpret(200, {}, None, json.dumps(body).encode())
    assert (answer.cached_tokens, answer.cache_write_tokens) == (2048, 0)
    mini = Prices(0.15, 0.60, 0.075)
    assert billed(answer, mini) == pytest.approx((952 * 0.15 + 2048 * 0.075 + 50 * 0.6) / M)


def test_gemini_long_prompts_switch_both_prices_and_cached_content_is_a_read() -> None:
    deployment = Deployment(name="g", provider="gemini", model="gemini-2.5-pro",
                            api_key_env=KEY_ENV, rpm=60, tpm=1000)
    pro = Prices(1.25, 10.0, 0.125, "USD", long_context=Prices(2.5, 15.0, 0.25),
                 long_context_above=200_000)

    def answer(prompt: int, cached: int) -> ProviderResponse:
        body = {"candidates": [{"finishReason": "STOP", "content": {"parts": [{"text": "x"}]}}],
                "usageMetadata": {"promptTokenCount": prompt, "candidatesTokenCount": 80,
                                  "thoughtsTokenCount": 20, "cachedContentTokenCount": cached}}
        return GeminiProvider(deployment)._interpret(200, {}, None, json.dumps(body).encode())

    assert billed(answer(200_000, 0), pro) == pytest.approx((200_000 * 1.25 + 100 * 10) / M)
    assert billed(answer(250_000, 50_000), pro) == pytest.approx(
        (200_000 * 2.5 + 50_000 * 0.25 + 100 * 15) / M)


def test_the_range_prices_each_request_in_its_tier_and_requested_writes_high() -> None:
    tally = TokenTally()
    thresholds = (200_000,)
    tally.add(100_000, 1000, False, thresholds)
    tally.add(300_000, 1000, True, thresholds)  # over the threshold, asks for cache writes
    span = cost_range([SONNET], tally)
    assert span is not None
    assert span.low == pytest.approx((100_000 * 3 + 300_000 * 6) / M)
    assert span.high == pytest.approx((100_000 * 3 + 1000 * 15 + 300_000 * 12
                                       + 1000 * 22.5) / M)
    # A deployment without a tier prices both requests at its one rate
    flat = cost_range([Prices(3.0, 15.0)], tally)
    assert flat is not None and flat.high == pytest.approx((400_000 * 3 + 2000 * 15) / M)


TABLE = '''
[deployments.claude]
provider = "anthropic"
base_url = "http://127.0.0.1:9"
model = "claude-sonnet"
api_key_env = "QF_TEST_PRICES_KEY"
rpm = 60
tpm = 100000000
input_per_mtok = 3
output_per_mtok = 15
cached_input_per_mtok = 0.3
cache_write_per_mtok = 3.75
[deployments.claude.long_context]
above_tokens = 1000
input_per_mtok = 6
output_per_mtok = 22.5
cached_input_per_mtok = 0.6
cache_write_per_mtok = 7.5
[routes]
"*" = "claude"
'''


def anthropic_line(custom_id: str, chars: int, cached: bool) -> bytes:
    block: dict[str, Any] = {"type": "text", "text": "x" * chars}
    if cached:
        block["cache_control"] = {"type": "ephemeral"}
    return json.dumps({"custom_id": custom_id, "params": {
        "model": "claude-sonnet", "max_tokens": 10,
        "messages": [{"role": "user", "content": [block]}]}}).encode() + b"\n"


def test_the_estimate_and_submits_check_count_tiers_and_cache_writes(tmp_path: Path) -> None:
    (tmp_path / "d.toml").write_text(TABLE)
    settings = Settings(deployments_file=tmp_path / "d.toml")
    deployments = load_deployments(tmp_path / "d.toml")
    # 400 prompt tokens without caching, 400 asking for cache writes, 2000 over the tier
    data = (anthropic_line("a", 1600, False) + anthropic_line("b", 1600, True)
            + anthropic_line("c", 8000, False))
    found = scan_file(io.BytesIO(data), settings, deployments, "bulk")
    for cost in (found.submit_cost, found.cost[0]):
        assert cost is not None
        assert cost.low == pytest.approx((800 * 3 + 2000 * 6) / M)
        assert cost.high == pytest.approx((400 * 3 + 400 * 3.75 + 20 * 15 + 2000 * 6
                                           + 10 * 22.5) / M)


def test_the_deployments_file_refuses_prices_that_cannot_be_billed() -> None:
    base: dict[str, Any] = dict(name="d", provider="mock", model="m", rpm=60, tpm=1000)
    with pytest.raises(ValidationError, match="cache_write_per_mtok needs input_per_mtok"):
        Deployment(**base, cache_write_per_mtok=3.75)
    with pytest.raises(ValidationError, match="cache_write_1h_per_mtok needs cache_write"):
        Deployment(**base, input_per_mtok=3, output_per_mtok=15, cache_write_1h_per_mtok=6)
    with pytest.raises(ValidationError, match="missing on long_context"):
        Deployment(**base, input_per_mtok=3, output_per_mtok=15, cache_write_per_mtok=3.75,
                   long_context={"above_tokens": 200_000, "input_per_mtok": 6,
                                 "output_per_mtok": 22.5})
    with pytest.raises(ValidationError, match="Extra inputs"):
        Deployment(**base, input_per_mtok=3, output_per_mtok=15,
                   long_context={"above": 200_000, "input_per_mtok": 6, "output_per_mtok": 9})
    prices = Deployment(**base, input_per_mtok=3, output_per_mtok=15,
                        long_context={"above_tokens": 200_000, "input_per_mtok": 6,
                                      "output_per_mtok": 22.5}).prices
    assert prices is not None and prices.long_context_above == 200_000
    assert prices.long_context == Prices(6.0, 22.5)

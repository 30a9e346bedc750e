"""Anthropic's Messages API mapping: requests out, answers and errors back, deployments."""

import json
from typing import Any

import pytest
from pydantic import ValidationError

from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import PermanentProviderError, RetryableProviderError
from quotaflow.ingest.formats import parse_line
from quotaflow.providers.anthropic import AnthropicProvider
from quotaflow.providers.anthropic_answers import (
    completion_from_message,
    message_from_completion,
    reshape,
)
from quotaflow.providers.base import ProviderResponse
from quotaflow.providers.translate.to_anthropic import messages_request
from quotaflow.results.output import render_anthropic


def message(stop_reason: str = "end_turn", **usage: int) -> dict[str, Any]:
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude",
            "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "!"}],
            "stop_reason": stop_reason, "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 3, **usage}}


def test_an_openai_chat_body_becomes_a_messages_request() -> None:
    body = {"model": "ignored", "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}],
        "max_completion_tokens": 64, "temperature": 0.2, "top_p": 0.9, "stop": "END",
        "n": 1}
    assert messages_request(body, "claude-x", 1024) == {
        "model": "claude-x", "system": "be brief", "max_tokens": 64, "temperature": 0.2,
        "top_p": 0.9, "stop_sequences": ["END"], "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]}


def test_max_tokens_is_required_by_anthropic_so_the_default_stands_in() -> None:
    request = messages_request({"messages": [{"role": "user", "content": "x"}],
                                "stop": ["a", "b"]}, "claude", 333)
    assert request["max_tokens"] == 333 and request["stop_sequences"] == ["a", "b"]
    assert "system" not in request


def test_an_anthropic_lines_params_are_sent_as_written() -> None:
    params = {"model": "claude", "max_tokens": 50, "top_k": 5,
              "system": [{"type": "text", "text": "rules", "cache_control": {"type": "ephemeral"}}],
              "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    request = parse_line(1, json.dumps({"custom_id": "a", "params": params}).encode())
    assert messages_request(request.body, "claude-deployed", 1024) == {
        **params, "model": "claude-deployed"}


@pytest.mark.parametrize(("stop_reason", "finish_reason"), [
    ("end_turn", "stop"), ("stop_sequence", "stop"), ("max_tokens", "length"),
    ("tool_use", "tool_calls")])
def test_a_message_becomes_a_chat_completion(stop_reason: str, finish_reason: str) -> None:
    body = completion_from_message(message(stop_reason, cache_read_input_tokens=4,
                                           cache_creation_input_tokens=2))
    assert body["object"] == "chat.completion" and body["id"] == "msg_1"
    assert body["choices"][0]["message"]["content"] == "Hello!"
    assert body["choices"][0]["finish_reason"] == finish_reason
    assert body["usage"] == {"prompt_tokens": 16, "completion_tokens": 3, "total_tokens": 19,
                             "prompt_tokens_details": {"cached_tokens": 4}}


def test_tool_use_blocks_become_tool_calls() -> None:
    answer = message("tool_use")
    answer["content"] = [{"type": "tool_use", "id": "toolu_1", "name": "get",
                          "input": {"city": "Oslo"}}]
    call = completion_from_message(answer)["choices"][0]["message"]["tool_calls"][0]
    assert call == {"id": "toolu_1", "type": "function",
                    "function": {"name": "get", "arguments": '{"city":"Oslo"}'}}


def test_a_chat_completion_becomes_a_message() -> None:
    completion = {"id": "chatcmpl-1", "model": "gpt", "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Hi"},
         "finish_reason": "length"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2,
                  "prompt_tokens_details": {"cached_tokens": 4}}}
    assert message_from_completion(completion) == {
        "id": "chatcmpl-1", "type": "message", "role": "assistant", "model": "gpt",
        "content": [{"type": "text", "text": "Hi"}], "stop_reason": "max_tokens",
        "stop_sequence": None, "usage": {"input_tokens": 6, "output_tokens": 2,
                                         "cache_creation_input_tokens": 0,
                                         "cache_read_input_tokens": 4}}


def test_reshape_drops_the_providers_bytes_for_the_made_over_body() -> None:
    response = ProviderResponse(200, message(), "req", 10, 3, raw=b"{}",
                                answer_format="anthropic")
    made = reshape(response, "openai")
    assert made.raw is None and made.answer_format == "openai"
    assert made.body["object"] == "chat.completion" and made.prompt_tokens == 10


def test_anthropic_result_lines() -> None:
    ok = render_anthropic("r", "a", 200, json.dumps(message()), None)
    assert json.loads(ok) == {"custom_id": "a", "result": {"type": "succeeded",
                                                           "message": message()}}
    provider_error = {"type": "error", "error": {"type": "invalid_request_error",
                                                 "message": "bad"}}
    errored = render_anthropic("r", "b", 400, json.dumps(provider_error), json.dumps(
        {"code": "provider_error", "line": 2, "message": "HTTP 400"}))
    assert json.loads(errored)["result"] == {"type": "errored", "error": provider_error}
    unanswered = render_anthropic("r", "c", None, None, json.dumps(
        {"code": "no_deployment", "line": 3, "message": "no route"}))
    assert json.loads(unanswered)["result"] == {"type": "errored", "error": {
        "type": "error", "error": {"type": "not_found_error", "message": "no route"}}}
    for code, kind in (("batch_cancelled", "canceled"), ("batch_expired", "expired")):
        line = render_anthropic("r", "d", None, None, json.dumps({"code": code, "line": 4,
                                                                  "message": "not sent"}))
        assert json.loads(line) == {"custom_id": "d", "result": {"type": kind}}


def deployment(**changes: Any) -> Deployment:
    return Deployment(**{"name": "claude", "provider": "anthropic", "model": "claude",
                         "base_url": "http://127.0.0.1:1", "rpm": 60, "itpm": 6000,
                         "otpm": 1200, **changes})


def test_itpm_and_otpm_make_a_split_budget() -> None:
    made = deployment()
    assert made.split_tokens and made.tpm == 7200 and made.anthropic_version == "2023-06-01"
    budget = made.budget
    assert budget.split and budget.itpm == 6000 and budget.tpm == 1200
    assert not (deployment(itpm=None, otpm=None, tpm=5000)).budget.split


@pytest.mark.parametrize(("changes", "message"), [
    ({"otpm": None}, "set itpm and otpm together"),
    ({"tpm": 100}, "set tpm or itpm and otpm, not both"),
    ({"itpm": None, "otpm": None}, "tpm (or itpm and otpm) is required"),
    ({"provider": "openai"}, "provider 'openai' has one token limit"),
    ({"base_url": None}, "provider 'anthropic' needs base_url"),
])
def test_token_limits_are_explained(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        deployment(**changes)


def provider() -> AnthropicProvider:
    return AnthropicProvider(deployment())


def error(kind: str, text: str = "no") -> bytes:
    return json.dumps({"type": "error", "error": {"type": kind, "message": text}}).encode()


def test_an_answer_is_read_with_its_usage_and_headers() -> None:
    headers = {"anthropic-ratelimit-requests-remaining": "59",
               "anthropic-ratelimit-input-tokens-remaining": "5000",
               "anthropic-ratelimit-output-tokens-remaining": "1100", "request-id": "req_9"}
    answer = provider()._interpret(200, headers, "OK", json.dumps(
        message(cache_read_input_tokens=4)).encode())
    assert (answer.prompt_tokens, answer.completion_tokens, answer.cached_tokens) == (14, 3, 4)
    assert (answer.remaining_requests, answer.remaining_input_tokens,
            answer.remaining_tokens) == (59, 5000, 1100)
    assert answer.answer_format == "anthropic" and answer.request_id == "req_9"


@pytest.mark.parametrize(("status", "kind", "retryable"), [
    (529, "overloaded_error", True), (429, "rate_limit_error", True), (500, "api_error", True),
    (400, "invalid_request_error", False), (401, "authentication_error", False)])
def test_errors_are_retryable_or_permanent(status: int, kind: str, retryable: bool) -> None:
    expected = RetryableProviderError if retryable else PermanentProviderError
    with pytest.raises(expected) as raised:
        provider()._interpret(status, {"retry-after": "7",
                                       "anthropic-ratelimit-input-tokens-remaining": "0"},
                              None, error(kind, "why"))
    assert raised.value.status_code == status and kind in str(raised.value)
    assert raised.value.retry_after == 7 and raised.value.remaining_input == 0
    if not retryable:
        assert raised.value.body == json.loads(error(kind, "why"))
    if retryable:
        assert not isinstance(raised.value, PermanentProviderError)


def test_a_429_without_retry_after_waits_for_the_exhausted_limits_reset() -> None:
    from datetime import UTC, datetime, timedelta

    reset = (datetime.now(UTC) + timedelta(seconds=5)).isoformat()
    with pytest.raises(RetryableProviderError) as raised:
        provider()._interpret(429, {"anthropic-ratelimit-output-tokens-remaining": "0",
                                    "anthropic-ratelimit-output-tokens-reset": reset},
                              None, error("rate_limit_error"))
    assert 3 < raised.value.retry_after <= 5


def test_thinking_becomes_reasoning_content_and_back() -> None:
    answer = {**message("tool_use"), "content": [
        {"type": "thinking", "thinking": "Paris is in France.", "signature": "sig"},
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]}
    reply = completion_from_message(answer)["choices"][0]["message"]
    assert reply["reasoning_content"] == "Paris is in France." and reply["content"] == "Checking."
    assert reply["tool_calls"][0]["function"]["name"] == "get_weather"
    completion = completion_from_message(answer)
    back = message_from_completion(completion)
    assert [block["type"] for block in back["content"]] == ["thinking", "text", "tool_use"]
    assert back["content"][0]["thinking"] == "Paris is in France."
    assert back["stop_reason"] == "tool_use"


def test_an_openai_refusal_is_a_refusal_message() -> None:
    completion = {"id": "c", "model": "gpt", "usage": {}, "choices": [{"index": 0, "message": {
        "role": "assistant", "content": None, "refusal": "I can't help with that."},
        "finish_reason": "stop"}]}
    made = message_from_completion(completion)
    assert made["stop_reason"] == "refusal"
    assert made["content"] == [{"type": "text", "text": "I can't help with that."}]

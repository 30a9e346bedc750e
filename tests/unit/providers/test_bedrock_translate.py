"""Bedrock's request and answer shapes: OpenAI and Anthropic lines to Converse and to
InvokeModel, refusals naming their field, and Converse answers back in both output shapes."""

import json
from typing import Any

import pytest

from quotaflow.constants import ANTHROPIC_PARAMS, OUTPUT_ANTHROPIC, OUTPUT_OPENAI
from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import Untranslatable
from quotaflow.providers.anthropic_answers import reshape
from quotaflow.providers.base import ProviderResponse
from quotaflow.providers.bedrock_answers import message_from_converse
from quotaflow.providers.translate.body import request_body
from quotaflow.providers.translate.to_converse_content import document_name

MODEL = "anthropic.claude-test-v1:0"
PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5E"
       "rkJggg==")
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                         "parameters": {"type": "object"}, "strict": True}}


def bedrock(api: str = "converse") -> Deployment:
    return Deployment(name="br", provider="bedrock", model=MODEL, rpm=60, tpm=100_000,
                      region="us-east-1", bedrock_api=api)


def anthropic_line(**params: Any) -> dict[str, Any]:
    return {"model": "x", ANTHROPIC_PARAMS: {"model": "x", "max_tokens": 100, **params}}


def test_an_openai_chat_body_becomes_a_converse_request() -> None:
    body = {"model": "x", "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                     {"type": "image_url", "image_url": {
                                         "url": f"data:image/png;base64,{PNG}"}}]},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "snow"},
        {"role": "user", "content": "and tomorrow?"}],
        "max_completion_tokens": 64, "temperature": 0.2, "top_p": 0.9, "stop": ["END"],
        "tools": [TOOL], "tool_choice": "required", "user": "u-1"}
    assert request_body(body, bedrock()) == {
        "system": [{"text": "be brief"}],
        "messages": [
            {"role": "user", "content": [
                {"text": "what is this?"},
                {"image": {"format": "png", "source": {"bytes": PNG}}}]},
            {"role": "assistant", "content": [
                {"text": "Let me check."},
                {"toolUse": {"toolUseId": "call_1", "name": "get_weather",
                             "input": {"city": "Oslo"}}}]},
            # the tool result's turn and the next user turn: one user message
            {"role": "user", "content": [
                {"toolResult": {"toolUseId": "call_1", "content": [{"text": "snow"}]}},
                {"text": "and tomorrow?"}]}],
        "inferenceConfig": {"maxTokens": 64, "temperature": 0.2, "topP": 0.9,
                            "stopSequences": ["END"]},
        "toolConfig": {"tools": [{"toolSpec": {
            "name": "get_weather", "description": "Weather",
            "inputSchema": {"json": {"type": "object"}}, "strict": True}}],
            "toolChoice": {"any": {}}}}


def test_an_anthropic_line_becomes_a_converse_request_with_cache_points() -> None:
    line = anthropic_line(
        system=[{"type": "text", "text": "a long contract", "cache_control": {
            "type": "ephemeral", "ttl": "1h"}}],
        messages=[{"role": "user", "content": [
            {"type": "document", "title": "Annual report.pdf", "source": {
                "type": "base64", "media_type": "application/pdf", "data": "JVBERi0="}},
            {"type": "text", "text": "summarise"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                          "content": "failed", "is_error": True}]}],
        tools=[{"name": "f", "input_schema": {"type": "object"}}],
        tool_choice={"type": "tool", "name": "f"}, top_k=40, metadata={"user_id": "u"},
        thinking={"type": "enabled", "budget_tokens": 50},
        output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}},
        cache_control={"type": "ephemeral"})
    got = request_body(line, bedrock())
    assert got["system"] == [{"text": "a long contract"},
                             {"cachePoint": {"type": "default", "ttl": "1h"}}]
    assert got["messages"][0]["content"][0] == {"document": {
        "name": "Annual report", "format": "pdf", "source": {"bytes": "JVBERi0="}}}
    assert got["messages"][1]["content"][0] == {
        "reasoningContent": {"reasoningText": {"text": "hmm", "signature": "sig"}}}
    # top-level cache_control: a cache point after the last block
    assert got["messages"][2]["content"] == [
        {"toolResult": {"toolUseId": "t1", "content": [{"text": "failed"}], "status": "error"}},
        {"cachePoint": {"type": "default"}}]
    assert got["toolConfig"]["toolChoice"] == {"tool": {"name": "f"}}
    assert got["additionalModelRequestFields"] == {
        "top_k": 40, "thinking": {"type": "enabled", "budget_tokens": 50}}
    assert json.loads(got["outputConfig"]["textFormat"]["structure"]["jsonSchema"]["schema"]) \
        == {"type": "object"}
    assert "metadata" not in got and "model" not in got


def test_invoke_sends_the_messages_params_with_bedrocks_version() -> None:
    line = anthropic_line(messages=[{"role": "user", "content": "hi"}], top_k=5,
                          metadata={"user_id": "u"}, service_tier="auto")
    assert request_body(line, bedrock("invoke")) == {
        "anthropic_version": "bedrock-2023-05-31", "max_tokens": 100, "top_k": 5,
        "messages": [{"role": "user", "content": "hi"}]}
    openai = {"model": "x", "messages": [{"role": "system", "content": "s"},
                                         {"role": "user", "content": "hi"}], "max_tokens": 9}
    assert request_body(openai, bedrock("invoke")) == {
        "anthropic_version": "bedrock-2023-05-31", "system": "s", "max_tokens": 9,
        "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(("api", "body", "field"), [
    ("converse", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": "https://example.com/a.png"}}]}]}, "body.messages[0].content[0].image_url.url"),
    ("converse", {"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "low"},
     "body.reasoning_effort"),
    ("converse", {"messages": [{"role": "user", "content": "hi"}], "tools": [TOOL],
                  "parallel_tool_calls": False}, "body.parallel_tool_calls"),
    ("converse", {"messages": [{"role": "user", "content": "hi"}], "tools": [TOOL],
                  "tool_choice": "none"}, "body.tool_choice"),
    ("converse", {"messages": [{"role": "user", "content": "hi"}], "seed": 1}, "body.seed"),
    ("invoke", {"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"1": 1}},
     "body.logit_bias"),
])
def test_an_openai_field_bedrock_cannot_take_fails_naming_it(
        api: str, body: dict[str, Any], field: str) -> None:
    with pytest.raises(Untranslatable) as caught:
        request_body({"model": "x", **body}, bedrock(api))
    assert caught.value.param == field
    assert "Bedrock" in str(caught.value) and "Anthropic Messages" not in str(caught.value)


@pytest.mark.parametrize(("api", "params", "field"), [
    ("converse", {"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "url", "url": "https://x/a.png"}}]}]}, "params.messages[0].content[0].source"),
    ("converse", {"output_config": {"effort": "high"}}, "params.output_config.effort"),
    ("converse", {"tool_choice": {"type": "none"}, "tools": [{"name": "f", "input_schema": {}}]},
     "params.tool_choice"),
    ("converse", {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     "params.tools[0]"),
    ("converse", {"messages": [{"role": "user", "content": [{"type": "document", "source": {
        "type": "text", "data": "x"}, "citations": {"enabled": True}}]}]},
     "params.messages[0].content[0].citations"),
    ("converse", {"container": "c"}, "params.container"),
    ("invoke", {"output_config": {"effort": "high"}}, "params.output_config"),
    ("invoke", {"messages": [{"role": "user", "content": [{"type": "document", "source": {
        "type": "url", "url": "https://x/a.pdf"}}]}]}, "params.messages[0].content[0].source"),
])
def test_an_anthropic_field_bedrock_cannot_take_fails_naming_it(
        api: str, params: dict[str, Any], field: str) -> None:
    params = {"messages": [{"role": "user", "content": "hi"}], **params}
    with pytest.raises(Untranslatable) as caught:
        request_body(anthropic_line(**params), bedrock(api))
    assert caught.value.param == field


def test_document_names_keep_to_conserves_characters() -> None:
    assert document_name("draconomicon.pdf") == "draconomicon"
    assert document_name("Q3 report: final  (v2).pdf") == "Q3 report- final (v2)"
    assert document_name(None) == "document"


def converse_answer(**extra: Any) -> dict[str, Any]:
    return {"output": {"message": {"role": "assistant", "content": [
        {"reasoningContent": {"reasoningText": {"text": "think", "signature": "sig"}}},
        {"text": "It is sunny."},
        {"toolUse": {"toolUseId": "tooluse_1", "name": "f", "input": {"a": 1}}}]}},
        "stopReason": "tool_use", "metrics": {"latencyMs": 5},
        "usage": {"inputTokens": 10, "outputTokens": 4, "totalTokens": 20,
                  "cacheReadInputTokens": 6, "cacheWriteInputTokens": 0}, **extra}


def test_a_converse_answer_comes_back_in_either_output_shape() -> None:
    message = message_from_converse(converse_answer(), MODEL, "req-1")
    assert message == {
        "id": "msg_bdrk_req-1", "type": "message", "role": "assistant", "model": MODEL,
        "content": [{"type": "thinking", "thinking": "think", "signature": "sig"},
                    {"type": "text", "text": "It is sunny."},
                    {"type": "tool_use", "id": "tooluse_1", "name": "f", "input": {"a": 1}}],
        "stop_reason": "tool_use", "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 4, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 6}}
    response = ProviderResponse(200, message, "req-1", 16, 4, cached_tokens=6,
                                answer_format=OUTPUT_ANTHROPIC)
    completion = reshape(response, OUTPUT_OPENAI).body
    choice = completion["choices"][0]
    assert completion["object"] == "chat.completion" and choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "It is sunny."
    assert choice["message"]["reasoning_content"] == "think"
    assert json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]) == {"a": 1}
    assert completion["usage"] == {"prompt_tokens": 16, "completion_tokens": 4,
                                   "total_tokens": 20, "prompt_tokens_details": {
                                       "cached_tokens": 6}}


def test_a_guardrail_ends_the_answer_as_a_refusal() -> None:
    message = message_from_converse(converse_answer(stopReason="guardrail_intervened"), MODEL,
                                    None)
    assert message["stop_reason"] == "refusal" and message["id"] == "msg_bdrk"

"""Gemini's generateContent mapping: OpenAI and Anthropic requests out, answers and 429s
back, and the deployment tables of the two Google kinds."""

import json
from typing import Any

import pytest
from pydantic import ValidationError

from quotaflow.constants import ANTHROPIC_PARAMS, OUTPUT_ANTHROPIC
from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import PermanentProviderError, RetryableProviderError, Untranslatable
from quotaflow.providers.anthropic_answers import reshape
from quotaflow.providers.gemini import GeminiProvider, google_base_url, model_path
from quotaflow.providers.gemini_answers import completion_from_generate, parse_duration
from quotaflow.providers.translate.gemini_schema import gemini_schema
from quotaflow.providers.translate.to_gemini import generate_request

KEY_ENV = "QF_TEST_GEMINI_UNIT_KEY"


def refused(body: dict[str, Any]) -> str:
    with pytest.raises(Untranslatable) as caught:
        generate_request(body, 1024)
    assert "has no Gemini generateContent equivalent" in str(caught.value)
    return caught.value.param


def test_an_openai_chat_body_becomes_a_generate_content_request() -> None:
    body = {"model": "ignored", "messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {
            "type": "ephemeral"}}, {"type": "image_url", "image_url": {
                "url": "data:image/png;base64,AAAA", "detail": "auto"}}]},
        {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}],
        "max_completion_tokens": 64, "temperature": 1.5, "top_p": 0.9, "stop": "END", "n": 2,
        "seed": 7, "user": "u-1", "store": False, "response_format": {"type": "json_object"}}
    assert generate_request(body, 1024) == {
        "systemInstruction": {"parts": [{"text": "be brief"}]},
        "contents": [
            {"role": "user", "parts": [{"text": "hi"}, {"inlineData": {
                "mimeType": "image/png", "data": "AAAA"}}]},
            {"role": "model", "parts": [{"text": "hello"}]},
            {"role": "user", "parts": [{"text": "more"}]}],
        "generationConfig": {"maxOutputTokens": 64, "temperature": 1.5, "topP": 0.9,
                             "seed": 7, "stopSequences": ["END"], "candidateCount": 2,
                             "responseMimeType": "application/json"}}


def test_tools_calls_and_results_become_function_declarations_calls_and_responses() -> None:
    tool = {"type": "function", "function": {"name": "weather", "description": "w",
            "parameters": {"type": "object", "properties": {
                "city": {"type": ["string", "null"]}, "days": {"type": "integer"}},
                "required": ["city"], "additionalProperties": False}, "strict": True}}
    body = {"messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {
                "name": "weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "snow"}],
        "tools": [tool], "tool_choice": {"type": "function", "function": {"name": "weather"}}}
    request = generate_request(body, 100)
    assert request["contents"][1:] == [
        {"role": "model", "parts": [{"functionCall": {"name": "weather",
                                                      "args": {"city": "Oslo"}}}]},
        {"role": "user", "parts": [{"functionResponse": {
            "name": "weather", "response": {"content": "snow"}}}]}]
    assert request["tools"] == [{"functionDeclarations": [{
        "name": "weather", "description": "w", "parameters": {
            "type": "OBJECT", "properties": {"city": {"type": "STRING", "nullable": True},
                                             "days": {"type": "INTEGER"}},
            "required": ["city"]}}]}]
    assert request["toolConfig"] == {"functionCallingConfig": {
        "mode": "ANY", "allowedFunctionNames": ["weather"]}}
    body["tool_choice"] = "auto"  # strict: the arguments held to the schema
    assert generate_request(body, 100)["toolConfig"] == {
        "functionCallingConfig": {"mode": "VALIDATED"}}


def test_a_json_schema_response_format_becomes_response_schema() -> None:
    body = {"messages": [{"role": "user", "content": "x"}], "response_format": {
        "type": "json_schema", "json_schema": {"name": "out", "strict": True, "schema": {
            "type": "object", "properties": {"b": {"type": "string", "enum": ["x", "y"]},
                                             "a": {"type": "array", "items": {
                                                 "type": "number"}}}}}}}
    config = generate_request(body, 100)["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    assert config["responseSchema"] == {
        "type": "OBJECT", "properties": {"b": {"type": "STRING", "enum": ["x", "y"]},
                                         "a": {"type": "ARRAY", "items": {"type": "NUMBER"}}}}


@pytest.mark.parametrize(("body", "field"), [
    ({"logit_bias": {"1": 2}}, "body.logit_bias"),
    ({"logprobs": True}, "body.logprobs"),
    ({"reasoning_effort": "low"}, "body.reasoning_effort"),
    ({"parallel_tool_calls": False}, "body.parallel_tool_calls"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": "https://example.com/cat.png"}}]}]}, "body.messages[0].content[0].image_url.url"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {
        "url": "data:image/png;base64,AA", "detail": "low"}}]}]},
     "body.messages[0].content[0].image_url.detail"),
    ({"messages": [{"role": "user", "content": "a", "name": "bob"}]}, "body.messages[0].name"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]},
     "body.messages[1]"),
    ({"messages": [{"role": "tool", "tool_call_id": "nope", "content": "a"}]},
     "body.messages[0].tool_call_id"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "$defs": {}}}}}, "body.response_format.json_schema.schema.$defs"),
])
def test_a_field_gemini_cannot_take_fails_the_line_naming_it(body: dict, field: str) -> None:
    assert refused({"messages": [{"role": "user", "content": "hi"}], **body}) == field


def test_schema_keywords_outside_geminis_subset_are_named() -> None:
    with pytest.raises(Untranslatable) as caught:
        gemini_schema({"type": "object", "properties": {"x": {"oneOf": []}}}, "s")
    assert caught.value.param == "s.properties.x.oneOf"
    with pytest.raises(Untranslatable):
        gemini_schema({"type": "object", "additionalProperties": {"type": "string"}}, "s")


def anthropic_line(**params: Any) -> dict[str, Any]:
    return {ANTHROPIC_PARAMS: {"model": "m", "max_tokens": 50, "messages": [
        {"role": "user", "content": "hi"}], **params}, "model": "m"}


def test_an_anthropic_lines_params_become_a_generate_content_request() -> None:
    request = generate_request(anthropic_line(
        system=[{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
        top_k=5, stop_sequences=["Z"], metadata={"user_id": "u"}), 1024)
    assert request == {"systemInstruction": {"parts": [{"text": "sys"}]},
                       "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
                       "generationConfig": {"maxOutputTokens": 50, "stopSequences": ["Z"],
                                            "topK": 5}}


def test_an_anthropic_field_is_refused_by_the_name_the_line_gave_it() -> None:
    assert refused(anthropic_line(thinking={"type": "enabled", "budget_tokens": 10})) \
        == "params.thinking"
    assert refused(anthropic_line(tools=[{"name": "t", "input_schema": {"type": "object"}}],
                                  tool_choice={"type": "auto",
                                               "disable_parallel_tool_use": True})) \
        == "params.tool_choice.disable_parallel_tool_use"
    assert refused(anthropic_line(messages=[{"role": "user", "content": [{
        "type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]}])) \
        == "params.messages[0].content[0].source"


def answer(**extra: Any) -> dict[str, Any]:
    return {"candidates": [{"index": 0, "finishReason": "STOP", "content": {
        "role": "model", "parts": [{"text": "thinking...", "thought": True},
                                   {"text": "Hel"}, {"text": "lo"}]}}],
            "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 3,
                              "thoughtsTokenCount": 4, "cachedContentTokenCount": 2,
                              "totalTokenCount": 17},
            "modelVersion": "gemini-2.5-flash", "responseId": "r1", **extra}


def test_an_answer_becomes_a_chat_completion() -> None:
    body = completion_from_generate(answer(), "fallback")
    assert body["id"] == "chatcmpl-r1" and body["model"] == "gemini-2.5-flash"
    assert body["choices"] == [{"index": 0, "logprobs": None, "finish_reason": "stop",
                                "message": {"role": "assistant", "content": "Hello",
                                            "refusal": None,
                                            "reasoning_content": "thinking..."}}]
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17,
                             "prompt_tokens_details": {"cached_tokens": 2},
                             "completion_tokens_details": {"reasoning_tokens": 4}}


def test_function_calls_become_tool_calls_and_an_anthropic_message_where_asked() -> None:
    payload = answer(candidates=[{"finishReason": "STOP", "content": {"parts": [
        {"functionCall": {"name": "weather", "args": {"city": "Oslo"}}}]}}])
    body = completion_from_generate(payload, "m")
    call = body["choices"][0]["message"]["tool_calls"][0]
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert call["function"] == {"name": "weather", "arguments": '{"city":"Oslo"}'}
    provider = GeminiProvider(deployment())
    response = provider._interpret(200, {}, None, json.dumps(payload).encode())
    assert (response.prompt_tokens, response.completion_tokens) == (10, 7)
    message = reshape(response, OUTPUT_ANTHROPIC).body
    assert message["type"] == "message" and message["stop_reason"] == "tool_use"
    assert message["content"][0]["input"] == {"city": "Oslo"}


def test_a_blocked_prompt_and_other_finish_reasons() -> None:
    blocked = completion_from_generate({"promptFeedback": {"blockReason": "SAFETY"}}, "m")
    assert blocked["choices"][0]["finish_reason"] == "content_filter"
    cut = answer(candidates=[{"finishReason": "MAX_TOKENS", "content": {"parts": [
        {"text": "x"}]}}])
    assert completion_from_generate(cut, "m")["choices"][0]["finish_reason"] == "length"


def deployment(**fields: Any) -> Deployment:
    base = {"name": "g", "provider": "gemini", "model": "gemini-2.5-flash",
            "api_key_env": KEY_ENV, "rpm": 60, "tpm": 1000}
    return Deployment(**{**base, **fields})


@pytest.fixture(autouse=True)
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "g-key")


def test_resource_exhausted_is_a_rate_limit_waiting_its_retry_delay() -> None:
    provider = GeminiProvider(deployment())
    body = {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "quota",
                      "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo",
                                   "retryDelay": "2.5s"}]}}
    with pytest.raises(RetryableProviderError) as caught:
        provider._interpret(429, {}, None, json.dumps(body).encode())
    assert caught.value.status_code == 429 and caught.value.retry_after == 2.5
    assert "RESOURCE_EXHAUSTED" in str(caught.value)
    with pytest.raises(PermanentProviderError):
        provider._interpret(400, {}, None, b'{"error": {"status": "INVALID_ARGUMENT"}}')
    with pytest.raises(RetryableProviderError):
        provider._interpret(503, {}, None, b'{"error": {"status": "UNAVAILABLE"}}')
    assert parse_duration("37s") == 37 and parse_duration("soon") is None


def test_urls_of_the_two_kinds() -> None:
    gemini = deployment()
    assert google_base_url(gemini) == "https://generativelanguage.googleapis.com/v1beta"
    assert model_path(gemini) == "models/gemini-2.5-flash:generateContent"
    vertex = Deployment(name="v", provider="vertex", model="gemini-2.5-pro", project="p1",
                        location="europe-west4", rpm=60, tpm=1000)
    assert google_base_url(vertex) == "https://europe-west4-aiplatform.googleapis.com/v1"
    assert model_path(vertex) == ("projects/p1/locations/europe-west4/publishers/google/"
                                  "models/gemini-2.5-pro:generateContent")
    assert google_base_url(vertex.model_copy(update={"location": "global"})) \
        == "https://aiplatform.googleapis.com/v1"


@pytest.mark.parametrize(("fields", "says"), [
    ({"api_key_env": None}, "needs api_key_env"),
    ({"project": "p"}, "Vertex AI's"),
    ({"provider": "vertex", "api_key_env": None}, "needs project and location"),
    ({"provider": "vertex", "project": "p", "location": "l"}, "OAuth"),
    ({"provider": "openai", "base_url": "http://x/v1", "location": "l"}, "Vertex AI's"),
])
def test_deployment_tables_of_the_google_kinds_are_checked(fields: dict, says: str) -> None:
    with pytest.raises(ValidationError, match=says):
        deployment(**fields)

"""Anthropic's Messages API answers, to and from the OpenAI shapes quotaflow stores.

A Message becomes an OpenAI chat.completion for jobs whose output is OpenAI's, and a
chat.completion becomes a Message for jobs whose output is Anthropic's, so a job's
output lines have one shape whichever provider answered: text, tool calls, thinking
(OpenAI-side `reasoning_content`, the field vLLM, DeepSeek and others answer with),
refusals and usage. (Requests are translated in quotaflow/providers/translate/.)

Plain dicts, not the `anthropic` SDK's pydantic models: this is on every answer's
path, and validating each body would cost more than the call's own parsing.
"""

import dataclasses
import time
from typing import Any

import orjson

from quotaflow.constants import OUTPUT_ANTHROPIC
from quotaflow.providers.base import ProviderResponse

# Anthropic's stop_reason -> OpenAI's finish_reason, and back.
FINISH_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
                  "tool_use": "tool_calls", "pause_turn": "stop", "refusal": "content_filter"}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                "function_call": "tool_use", "content_filter": "refusal"}
# HTTP status -> Anthropic's error type, for errors that did not come in Anthropic's shape.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 529: "overloaded_error"}


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def message_usage(message: dict[str, Any]) -> tuple[int, int, int, int, int]:
    """(prompt_tokens, completion_tokens, cache reads, cache writes, 1-hour cache writes)
    of a Message.

    prompt_tokens counts every input token as OpenAI's does (cache reads and writes
    included: Anthropic's input_tokens has neither); each kind is billed at its own price
    (quotaflow/deployments/pricing.py). The 1-hour writes are the part of the writes that
    `usage.cache_creation.ephemeral_1h_input_tokens` names, where the answer breaks them
    down.
    """
    usage = message.get("usage") or {}
    fresh = int(usage.get("input_tokens") or 0)
    written = int(usage.get("cache_creation_input_tokens") or 0)
    read = int(usage.get("cache_read_input_tokens") or 0)
    hour = 0
    if written:
        parts = usage.get("cache_creation")
        if isinstance(parts, dict):
            hour = int(parts.get("ephemeral_1h_input_tokens") or 0)
    return fresh + written + read, int(usage.get("output_tokens") or 0), read, written, hour


def completion_from_message(message: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI chat.completion body carrying an Anthropic Message's answer."""
    text: list[str] = []
    thinking: list[str] = []
    tool_calls: list[dict[str, Any]] = []
    for block in message.get("content") or ():
        if block.get("type") == "text":
            text.append(str(block.get("text", "")))
        elif block.get("type") == "thinking":
            thinking.append(str(block.get("thinking", "")))
        elif block.get("type") == "tool_use":
            tool_calls.append({"id": block.get("id"), "type": "function", "function": {
                "name": block.get("name"),
                "arguments": orjson.dumps(block.get("input", {})).decode()}})
    prompt, completion, cached, _, _ = message_usage(message)
    reply: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text else None,
                             "refusal": None}
    if tool_calls:
        reply["tool_calls"] = tool_calls
    if thinking:
        reply["reasoning_content"] = "".join(thinking)
    return {
        "id": message.get("id"), "object": "chat.completion", "created": int(time.time()),
        "model": message.get("model"),
        "choices": [{"index": 0, "message": reply, "logprobs": None,
                     "finish_reason": FINISH_REASONS.get(message.get("stop_reason") or "",
                                                         "stop")}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion,
                  "prompt_tokens_details": {"cached_tokens": cached}},
    }


def message_from_completion(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic Message carrying an OpenAI chat.completion's first choice."""
    choice = (body.get("choices") or [{}])[0]
    reply = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if reply.get("reasoning_content"):  # no signature: OpenAI-side reasoning has none
        content.append({"type": "thinking", "thinking": str(reply["reasoning_content"]),
                        "signature": ""})
    if reply.get("content"):
        content.append({"type": "text", "text": _text_of(reply["content"])})
    elif reply.get("refusal"):
        content.append({"type": "text", "text": str(reply["refusal"])})
    for call in reply.get("tool_calls") or ():
        function = call.get("function") or {}
        try:
            arguments = orjson.loads(function.get("arguments") or "{}")
        except orjson.JSONDecodeError:
            arguments = {"arguments": function.get("arguments")}
        content.append({"type": "tool_use", "id": call.get("id"), "name": function.get("name"),
                        "input": arguments})
    usage = body.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    cached = int(details.get("cached_tokens") or 0)
    return {
        "id": body.get("id"), "type": "message", "role": "assistant",
        "model": body.get("model"), "content": content,
        "stop_reason": "refusal" if reply.get("refusal") and not reply.get("content")
        else STOP_REASONS.get(choice.get("finish_reason") or "", "end_turn"),
        "stop_sequence": None,
        "usage": {"input_tokens": int(usage.get("prompt_tokens") or 0) - cached,
                  "output_tokens": int(usage.get("completion_tokens") or 0),
                  "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached},
    }


def reshape(response: ProviderResponse, output_format: str) -> ProviderResponse:
    """The answer in the job's output format: its body made over (and the provider's
    own bytes no longer what is stored)."""
    if output_format == OUTPUT_ANTHROPIC:
        body = message_from_completion(response.body)
    else:
        body = completion_from_message(response.body)
    return dataclasses.replace(response, body=body, raw=None, answer_format=output_format)


# quotaflow's error code of a line that got no answer -> Anthropic's error type.
CODE_TYPES = {"invalid_request": "invalid_request_error", "no_deployment": "not_found_error",
              "request_too_large": "request_too_large"}


def error_object(status_code: int | None, message: str, body: Any,
                 code: str | None = None) -> dict[str, Any]:
    """Anthropic's error object: the provider's own where it sent one in that shape."""
    if isinstance(body, dict) and body.get("type") == "error" and isinstance(
            body.get("error"), dict):
        return body
    if status_code is None:
        kind = CODE_TYPES.get(code or "", "api_error")
    else:
        kind = ERROR_TYPES.get(status_code, "api_error" if status_code >= 500
                               else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}

"""Gemini's generateContent answers and errors, read as quotaflow's OpenAI shapes.

An answer becomes an OpenAI chat.completion (every candidate a choice, text parts its
content, thought parts its `reasoning_content`, functionCall parts its tool calls), and
from there an Anthropic Message where the job's output is Anthropic's
(anthropic_answers.reshape), so a job's output lines have one shape whichever provider
answered. Usage is counted as OpenAI counts it: prompt tokens include cached ones and
tool-use prompts, completion tokens include thinking (billed as output, as OpenAI's
reasoning tokens are). A 429 (`RESOURCE_EXHAUSTED`) carries its wait in a RetryInfo
detail's `retryDelay`, not in a header.
"""

import time
import uuid
from typing import Any

import orjson

# Gemini's finishReason -> OpenAI's finish_reason (a function call made: tool_calls).
FINISH_REASONS = {"STOP": "stop", "MAX_TOKENS": "length", "SAFETY": "content_filter",
                  "RECITATION": "content_filter", "BLOCKLIST": "content_filter",
                  "PROHIBITED_CONTENT": "content_filter", "SPII": "content_filter",
                  "IMAGE_SAFETY": "content_filter", "LANGUAGE": "content_filter"}
RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"


def usage_counts(payload: dict[str, Any]) -> tuple[int, int, int, int]:
    """(prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens) of usageMetadata."""
    usage = payload.get("usageMetadata") or {}
    prompt = int(usage.get("promptTokenCount") or 0) + int(
        usage.get("toolUsePromptTokenCount") or 0)
    thoughts = int(usage.get("thoughtsTokenCount") or 0)
    completion = int(usage.get("candidatesTokenCount") or 0) + thoughts
    return prompt, completion, int(usage.get("cachedContentTokenCount") or 0), thoughts


def completion_from_generate(payload: dict[str, Any], model: str) -> dict[str, Any]:
    """An OpenAI chat.completion body carrying a generateContent answer."""
    candidates = sorted(payload.get("candidates") or (), key=lambda c: c.get("index") or 0)
    choices = [_choice(n, candidate) for n, candidate in enumerate(candidates)]
    if not choices:  # the prompt itself was blocked (promptFeedback.blockReason)
        choices = [{"index": 0, "logprobs": None, "finish_reason": "content_filter",
                    "message": {"role": "assistant", "content": None, "refusal": None}}]
    prompt, completion, cached, thoughts = usage_counts(payload)
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion,
                             "total_tokens": prompt + completion,
                             "prompt_tokens_details": {"cached_tokens": cached}}
    if thoughts:
        usage["completion_tokens_details"] = {"reasoning_tokens": thoughts}
    return {"id": f"chatcmpl-{payload.get('responseId') or uuid.uuid4().hex}",
            "object": "chat.completion", "created": int(time.time()),
            "model": payload.get("modelVersion") or model, "choices": choices, "usage": usage}


def _choice(index: int, candidate: dict[str, Any]) -> dict[str, Any]:
    text: list[str] = []
    thinking: list[str] = []
    calls: list[dict[str, Any]] = []
    for part in (candidate.get("content") or {}).get("parts") or ():
        if "functionCall" in part:
            call = part["functionCall"] or {}
            calls.append({"id": call.get("id") or f"call_{uuid.uuid4().hex[:24]}",
                          "type": "function", "function": {
                              "name": call.get("name"),
                              "arguments": orjson.dumps(call.get("args") or {}).decode()}})
        elif "text" in part:
            (thinking if part.get("thought") else text).append(str(part["text"]))
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text else None,
                               "refusal": None}
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    reason = "tool_calls" if calls else FINISH_REASONS.get(
        candidate.get("finishReason") or "STOP", "stop")
    return {"index": index, "message": message, "logprobs": None, "finish_reason": reason}


def error_parts(payload: Any) -> tuple[str | None, str | None, float | None]:
    """(status, message, retryDelay seconds) of Google's error body
    {"error": {"code", "message", "status", "details": [...]}}."""
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict):
        return None, None, None
    delay = None
    for detail in error.get("details") or ():
        if isinstance(detail, dict) and detail.get("@type") == RETRY_INFO:
            delay = parse_duration(detail.get("retryDelay"))
    return error.get("status"), error.get("message"), delay


def parse_duration(value: Any) -> float | None:
    """A protobuf Duration in JSON ("37s", "0.250s"), in seconds."""
    if not isinstance(value, str) or not value.endswith("s"):
        return None
    try:
        return max(0.0, float(value[:-1]))
    except ValueError:
        return None

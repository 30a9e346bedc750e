"""The strict provider's Anthropic Messages API: POST /v1/messages under RPM, ITPM and OTPM.

Counted the way Anthropic documents it, and written apart from quotaflow's limiter
(a judge built from the code it judges would agree with its bugs): on arrival a
request takes one request, its input tokens (the prompt's text at about four
characters a token, system included) and its max_tokens, all or nothing, from
three continuously refilling buckets; after the answer, with `reconcile`, the
output bucket gets back what max_tokens reserved and the answer did not use.
Refusals are Anthropic's: 429 rate_limit_error with retry-after, 529
overloaded_error (a fault), 400 invalid_request_error for a body the real API
refuses (unknown top-level fields among them), 401 authentication_error.
Every answer carries the anthropic-ratelimit-* headers, and its usage splits the prompt
into cache writes, cache reads and the rest where the request asks for caching
(mock_provider/prompt_cache.py).
"""

import asyncio
import hmac
import json
import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from mock_provider import faults as fault_modes
from mock_provider.buckets import TokenBucket
from mock_provider.prompt_cache import PromptCache
from mock_provider.shapes import messages_problem
from quotaflow.budget.tokens import estimate_tokens

# What Anthropic's Messages API accepts at the top level; anything else is a 400.
KNOWN_FIELDS = frozenset({"model", "messages", "max_tokens", "system", "temperature", "top_p",
                          "top_k", "stop_sequences", "metadata", "tools", "tool_choice",
                          "thinking", "stream", "service_tier", "container", "mcp_servers",
                          "output_config", "cache_control", "inference_geo", "speed"})
LIMITS = ("requests", "input-tokens", "output-tokens")


@dataclass(frozen=True)
class Verdict:
    """One admission's outcome and the three buckets' state for the headers."""

    admitted: bool
    limited_by: str | None  # one of LIMITS when refused
    wait_s: float
    remaining: dict[str, float]
    until_full: dict[str, float]


class SplitLimits:
    """Requests, input tokens and output tokens buckets, admitted together under one lock."""

    def __init__(self, rpm: float, itpm: float, otpm: float, burst_seconds: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._clock, self._lock = clock, threading.Lock()
        now = clock()
        self.limits = {"requests": rpm, "input-tokens": itpm, "output-tokens": otpm}
        self.buckets = {name: TokenBucket(limit, burst_seconds, now)
                        for name, limit in self.limits.items()}

    def try_admit(self, input_tokens: int, max_tokens: int) -> Verdict:
        wanted = {"requests": 1, "input-tokens": input_tokens, "output-tokens": max_tokens}
        with self._lock:
            now = self._clock()
            waits = {name: self.buckets[name].wait_for(wanted[name], now) for name in LIMITS}
            limited_by = max(waits, key=lambda name: waits[name])
            admitted = waits[limited_by] == 0.0
            if admitted:
                for name in LIMITS:
                    self.buckets[name].take(wanted[name], now)
            wait = waits[limited_by]
            if math.isinf(wait):
                wait = max(b.until_full(now) for b in self.buckets.values())
            return self._verdict(now, admitted, None if admitted else limited_by, wait)

    def refund_output(self, tokens: int) -> Verdict:
        with self._lock:
            now = self._clock()
            self.buckets["output-tokens"].give(tokens, now)
            return self._verdict(now, True, None, 0.0)

    def _verdict(self, now: float, admitted: bool, limited_by: str | None,
                 wait: float) -> Verdict:
        return Verdict(admitted, limited_by, wait,
                       {n: b.level(now) for n, b in self.buckets.items()},
                       {n: b.until_full(now) for n, b in self.buckets.items()})


def ratelimit_headers(limits: SplitLimits, verdict: Verdict) -> dict[str, str]:
    """anthropic-ratelimit-{requests,input-tokens,output-tokens,tokens}-{limit,remaining,
    reset}; reset in RFC 3339, the time the bucket is full again."""
    now = datetime.now(UTC)
    headers: dict[str, str] = {}
    for name in LIMITS:
        headers[f"anthropic-ratelimit-{name}-limit"] = str(int(limits.limits[name]))
        headers[f"anthropic-ratelimit-{name}-remaining"] = str(
            max(0, math.floor(verdict.remaining[name] + 1e-9)))
        headers[f"anthropic-ratelimit-{name}-reset"] = _stamp(now, verdict.until_full[name])
    tightest = min(("input-tokens", "output-tokens"), key=lambda n: verdict.remaining[n])
    for part in ("limit", "remaining", "reset"):
        headers[f"anthropic-ratelimit-tokens-{part}"] = headers[
            f"anthropic-ratelimit-{tightest}-{part}"]
    return headers


def _stamp(now: datetime, seconds: float) -> str:
    return (now + timedelta(seconds=seconds)).isoformat(timespec="seconds").replace("+00:00", "Z")


def error_response(status: int, kind: str, message: str,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """Anthropic's error shape, with a request-id as every answer has."""
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}},
                        status_code=status,
                        headers={**(headers or {}), "request-id": f"req_{uuid.uuid4().hex}"})


def prompt_of(body: dict[str, Any]) -> str:
    """The request's text as quotaflow.budget.tokens flattens a chat body: system first."""
    parts = [] if body.get("system") is None else [_text(body["system"])]
    parts += [_text(m.get("content")) for m in body["messages"]]
    return "\n".join(parts)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return json.dumps(content)


def invalid(body: Any) -> str | None:
    """Why the real API would refuse this body with a 400, or None."""
    if not isinstance(body, dict):
        return "the request body must be a JSON object"
    unknown = sorted(set(body) - KNOWN_FIELDS)
    if unknown:
        return f"{unknown[0]}: Extra inputs are not permitted"
    if not isinstance(body.get("model"), str):
        return "model: Field required"
    if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] < 1:
        return "max_tokens: Field required (a positive integer)"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and m.get("role") in ("user", "assistant") for m in messages):
        return "messages: a non-empty list of user and assistant messages is required"
    return messages_problem(body)


def simulated_message(body: dict[str, Any], input_tokens: int) -> dict[str, Any]:
    """A Message: 'simulated reply to: ' + the last user text, cut to max_tokens; a
    tool_use block where tool_choice forces a tool."""
    users = [m for m in body["messages"] if m.get("role") == "user"]
    text = "simulated reply to: " + (_text(users[-1].get("content")) if users else "")
    cut = len(text) > body["max_tokens"] * 4
    text = text[: body["max_tokens"] * 4]
    content: list[dict[str, Any]] = [{"type": "text", "text": text}]
    stop = "max_tokens" if cut else "end_turn"
    choice = body.get("tool_choice") or {}
    if body.get("tools") and choice.get("type") in ("any", "tool"):  # a forced tool call
        name = choice.get("name") or body["tools"][0].get("name")
        content = [{"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}", "name": name,
                    "input": {"simulated": True}}]
        stop = "tool_use"
    return {"id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant",
            "model": body["model"], "content": content,
            "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": estimate_tokens(text),
                      "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}


class MessagesJudge:
    """POST /v1/messages of the strict server; shares the judge's stats, faults and key."""

    def __init__(self, judge: Any, limits: SplitLimits) -> None:
        self.judge, self.limits = judge, limits
        self.cache = PromptCache()  # prompt caching's usage (mock_provider/prompt_cache.py)

    async def handle(self, request: Request) -> Response:
        judge = self.judge
        judge.stats.requests_total += 1
        key = judge.api_key
        if key is not None and not hmac.compare_digest(
                request.headers.get("x-api-key", "").encode(), key.encode()):
            return error_response(401, "authentication_error", "invalid x-api-key")
        try:
            body = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError):
            body = None
        reason = invalid(body)
        if reason is not None:
            return error_response(400, "invalid_request_error", reason)
        fault = judge.faults.draw()
        if fault in ("429", "500", "529"):  # before admission, in Anthropic's shape
            return _fault(fault)
        if fault == "reset":
            return fault_modes.reset()
        input_tokens, max_tokens = estimate_tokens(prompt_of(body)), body["max_tokens"]
        verdict = self.limits.try_admit(input_tokens, max_tokens)
        headers = ratelimit_headers(self.limits, verdict)
        stats = judge.stats
        if not verdict.admitted:
            stats.rejected_429 += 1
            stats.limited_by[verdict.limited_by or "requests"] += 1
            return error_response(
                429, "rate_limit_error",
                f"This request would exceed your organization's rate limit of "
                f"{self.limits.limits[verdict.limited_by or 'requests']:g} {verdict.limited_by}"
                " per minute (simulated). Please try again later.",
                {**headers, "retry-after": str(max(1, math.ceil(verdict.wait_s)))})
        stats.record_admitted(body, input_tokens + max_tokens)
        stats.input_tokens_admitted += input_tokens
        stats.output_tokens_admitted += max_tokens
        stats.in_flight += 1
        stats.peak_in_flight = max(stats.peak_in_flight, stats.in_flight)
        try:
            if judge.latency_s > 0:
                await asyncio.sleep(judge.latency_s)
            if fault == "hang":
                await fault_modes.hang()
        finally:
            stats.in_flight -= 1
        if fault == "malformed":
            return fault_modes.malformed()
        message = simulated_message(body, input_tokens)
        usage = message["usage"]
        usage.update(self.cache.usage(body, input_tokens))
        stats.record_usage({"prompt_tokens": input_tokens,
                            "completion_tokens": usage["output_tokens"]})
        if judge.reconcile:  # OTPM is adjusted to the output tokens the answer used
            unused = max_tokens - usage["output_tokens"]
            stats.tokens_refunded += unused
            headers = ratelimit_headers(self.limits, self.limits.refund_output(unused))
        return JSONResponse(message, headers={**headers, "request-id": f"req_{uuid.uuid4().hex}"})


def _fault(kind: str) -> JSONResponse:
    if kind == "529":
        return error_response(529, "overloaded_error", "Overloaded (simulated)")
    if kind == "500":
        return error_response(500, "api_error", "Internal server error (simulated)")
    return error_response(429, "rate_limit_error", "Rate limited (simulated storm)",
                          {"retry-after": "1"})

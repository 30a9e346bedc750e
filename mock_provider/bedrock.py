"""The strict provider's AWS Bedrock Runtime: POST /model/{modelId}/converse and
/model/{modelId}/invoke under RPM and TPM, each request's SigV4 signature checked.

Counted as Bedrock documents its on-demand quotas: a request takes one request and its
input tokens plus its max tokens (maxTokens, or InvokeModel's max_tokens) from two
continuously refilling buckets, all or nothing, and with `reconcile` the output tokens
it reserved and did not use come back after the answer. Bedrock sends no rate-limit
headers; a refusal is its ThrottlingException: 429 with x-amzn-ErrorType and
`{"message": ...}`. A signature that does not match is a 403 (bedrock_checks.py), a
body Bedrock would refuse a 400 ValidationException. Faults come in Bedrock's shapes:
429 ThrottlingException, 500 InternalServerException, and 529 as Bedrock's overload,
503 ServiceUnavailableException.
"""

import asyncio
import hmac
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from mock_provider import faults as fault_modes
from mock_provider.bedrock_checks import AwsKey, converse_problem, invoke_problem, signature_problem
from mock_provider.buckets import REQUESTS, RateLimits
from mock_provider.messages import prompt_of, simulated_message
from quotaflow.budget.tokens import estimate_tokens

Route = Callable[[Request], Awaitable[Response]]
_CORAL = "http://internal.amazon.com/coral/com.amazon.bedrock/"
STATUS = {"ThrottlingException": 429, "ValidationException": 400, "AccessDeniedException": 403,
          "InternalServerException": 500, "ServiceUnavailableException": 503}
FAULTS = {"429": ("ThrottlingException", "Too many requests, please wait before trying again."),
          "500": ("InternalServerException", "Internal server error (simulated)"),
          "529": ("ServiceUnavailableException",
                  "Too many connections, please wait before trying again.")}


def bedrock_error(kind: str, message: str, status: int | None = None) -> JSONResponse:
    """Bedrock's error shape: the message in the body, the exception's name in a header."""
    return JSONResponse({"message": message}, status_code=status or STATUS.get(kind, 403),
                        headers={"x-amzn-RequestId": str(uuid.uuid4()),
                                 "x-amzn-ErrorType": f"{kind}:{_CORAL}"})


class BedrockJudge:
    """The Bedrock routes of the strict server; shares the judge's stats, faults and
    latency, with request and token buckets of their own."""

    def __init__(self, judge: Any, limits: RateLimits, key: AwsKey | None) -> None:
        self.judge, self.limits, self.key = judge, limits, key

    def mount(self, app: FastAPI, wrap: Callable[[Route], Route]) -> None:
        for operation in ("converse", "invoke"):
            app.add_api_route(f"/model/{{model_id:path}}/{operation}",
                              wrap(self._route(operation)), methods=["POST"])

    def _route(self, operation: str) -> Route:
        async def route(request: Request) -> Response:
            return await self.handle(operation, request)

        return route

    def _refused_auth(self, request: Request, raw: bytes) -> JSONResponse | None:
        given = request.headers.get("authorization", "")
        bearer = self.judge.api_key
        if bearer is not None and given.startswith("Bearer "):  # a Bedrock API key
            if hmac.compare_digest(given.encode(), f"Bearer {bearer}".encode()):
                return None
            return bedrock_error("UnrecognizedClientException", "Invalid API Key format", 403)
        if self.key is None:
            return None
        raw_path = request.scope.get("raw_path", b"").decode("latin-1") or request.url.path
        problem = signature_problem(self.key, request.headers, raw_path,
                                    request.url.query, raw)
        return None if problem is None else bedrock_error(*problem, 403)

    async def handle(self, operation: str, request: Request) -> Response:
        judge = self.judge
        judge.stats.requests_total += 1
        raw = await request.body()
        refused = self._refused_auth(request, raw)
        if refused is not None:
            return refused
        if request.headers.get("content-type", "").split(";")[0] != "application/json":
            return bedrock_error("ValidationException", "Content-Type must be application/json")
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            body = None
        converse = operation == "converse"
        problem = converse_problem(body) if converse else invoke_problem(body)
        if problem is not None:
            return bedrock_error("ValidationException", problem)
        fault = judge.faults.draw()
        if fault in FAULTS:
            return bedrock_error(*FAULTS[fault])
        if fault == "reset":
            return fault_modes.reset()
        text, max_tokens = _prompt_and_ceiling(body, converse, judge.default_max_tokens)
        input_tokens = estimate_tokens(text)
        decision = self.limits.try_admit(input_tokens + max_tokens)
        stats = judge.stats
        if not decision.admitted:
            stats.rejected_429 += 1
            stats.limited_by[decision.limited_by or REQUESTS] += 1
            return bedrock_error(*FAULTS["429"])
        stats.record_admitted(body, input_tokens + max_tokens)
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
        model = request.path_params["model_id"]
        answer = (_converse_answer(body, text, input_tokens, max_tokens) if converse else
                  simulated_message({**body, "model": model, "max_tokens": max_tokens},
                                    input_tokens))
        used = answer["usage"].get("outputTokens", answer["usage"].get("output_tokens", 0))
        stats.record_usage({"input_tokens": input_tokens, "output_tokens": used})
        if judge.reconcile:  # the unused part of max tokens goes back to the bucket
            stats.tokens_refunded += max_tokens - used
            self.limits.settle(max_tokens - used)
        headers = {"x-amzn-RequestId": str(uuid.uuid4()),
                   "X-Amzn-Bedrock-Input-Token-Count": str(input_tokens),
                   "X-Amzn-Bedrock-Output-Token-Count": str(used)}
        return JSONResponse(answer, headers=headers)


def _prompt_and_ceiling(body: dict[str, Any], converse: bool, default: int) -> tuple[str, int]:
    """The request's text (system first, as the other judges flatten it) and its max tokens."""
    if not converse:
        return prompt_of(body), body["max_tokens"]
    texts = [b["text"] for b in body.get("system") or () if "text" in b]
    for message in body["messages"]:
        texts.append("".join(b["text"] for b in message["content"] if "text" in b))
    return "\n".join(texts), (body.get("inferenceConfig") or {}).get("maxTokens") or default


def _converse_answer(body: dict[str, Any], text: str, input_tokens: int,
                     max_tokens: int) -> dict[str, Any]:
    """'simulated reply to: ' + the last user text, cut to max tokens; a toolUse where
    toolChoice forces a tool."""
    users = [m for m in body["messages"] if m["role"] == "user"]
    last = "".join(b["text"] for b in users[-1]["content"] if "text" in b) if users else ""
    reply = ("simulated reply to: " + last)[: max_tokens * 4]
    content: list[dict[str, Any]] = [{"text": reply}]
    stop = "max_tokens" if len("simulated reply to: " + last) > max_tokens * 4 else "end_turn"
    config = body.get("toolConfig") or {}
    choice = config.get("toolChoice") or {}
    if "any" in choice or "tool" in choice:
        specs = [t["toolSpec"] for t in config["tools"] if "toolSpec" in t]
        name = (choice.get("tool") or {}).get("name") or specs[0]["name"]
        content = [{"toolUse": {"toolUseId": f"tooluse_{uuid.uuid4().hex[:22]}", "name": name,
                                "input": {"simulated": True}}}]
        stop = "tool_use"
    used = estimate_tokens(reply)
    return {"output": {"message": {"role": "assistant", "content": content}},
            "stopReason": stop,
            "usage": {"inputTokens": input_tokens, "outputTokens": used,
                      "totalTokens": input_tokens + used},
            "metrics": {"latencyMs": 1}}


"""The strict server's Google generateContent: the Gemini API and Vertex AI under RPM/TPM.

Gemini API: POST /v1beta/models/{model}:generateContent with the key in
x-goog-api-key. Vertex AI: POST /v1/projects/{project}/locations/{location}/publishers/
google/models/{model}:generateContent with a bearer token the token endpoint
(google_token.py) issued, for the service account's own project. Both share the
server's requests and tokens buckets (buckets.py, written apart from quotaflow's
limiter): a request takes one request and its prompt's text at about four characters a
token plus maxOutputTokens, all or nothing; with `reconcile` the unused output is
given back. A refusal is Google's: 429 RESOURCE_EXHAUSTED with a QuotaFailure and a
RetryInfo detail (no retry-after header: Google sends none), 400 INVALID_ARGUMENT for a
body the real API refuses (gemini_shapes.py), 401 UNAUTHENTICATED, 403
PERMISSION_DENIED, 404 NOT_FOUND.
"""

import asyncio
import hmac
import json
import math
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from mock_provider import faults as fault_modes
from mock_provider.buckets import REQUESTS, RateLimits
from mock_provider.gemini_shapes import request_problem
from mock_provider.google_token import TokenIssuer
from quotaflow.budget.tokens import estimate_tokens

STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
          404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}
METHOD = ":generateContent"


def google_error(code: int, message: str, details: list[dict[str, Any]] | None = None
                 ) -> JSONResponse:
    error: dict[str, Any] = {"code": code, "message": message, "status": STATUS[code]}
    if details:
        error["details"] = details
    return JSONResponse({"error": error}, status_code=code)


def exhausted(limit: str, wait_s: float) -> JSONResponse:
    """Google's 429: which quota, and when to try again (a protobuf Duration)."""
    metric = "requests" if limit == REQUESTS else "input_token_count"
    return google_error(429, "Resource has been exhausted (e.g. check quota).", [
        {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{
            "quotaMetric": f"generativelanguage.googleapis.com/generate_content_{metric}",
            "quotaId": f"GenerateContent{metric.title().replace('_', '')}PerMinute"}]},
        {"@type": "type.googleapis.com/google.rpc.RetryInfo",
         "retryDelay": f"{max(0.001, math.ceil(wait_s * 1000) / 1000):g}s"}])


def prompt_text(body: dict[str, Any]) -> str:
    """The request's text parts, system instruction first."""
    contents = list(body["contents"])
    if "systemInstruction" in body:
        contents.insert(0, body["systemInstruction"])
    return "\n".join(part["text"] for content in contents for part in content["parts"]
                     if "text" in part)


def simulated_answer(body: dict[str, Any], model: str, prompt_tokens: int) -> dict[str, Any]:
    """'simulated reply to: ' + the last user text, cut to maxOutputTokens; a
    functionCall where the tool config forces one."""
    config = body.get("generationConfig") or {}
    limit = config.get("maxOutputTokens") or 256
    users = [c for c in body["contents"] if c.get("role", "user") == "user"]
    last = " ".join(p["text"] for p in (users[-1]["parts"] if users else ()) if "text" in p)
    text = ("simulated reply to: " + last)[: limit * 4]
    calling = (body.get("toolConfig") or {}).get("functionCallingConfig") or {}
    part: dict[str, Any] = {"text": text}
    if calling.get("mode") == "ANY":
        names = calling.get("allowedFunctionNames") or [
            body["tools"][0]["functionDeclarations"][0]["name"]]
        part = {"functionCall": {"name": names[0], "args": {"simulated": True}}}
    finish = "MAX_TOKENS" if len("simulated reply to: " + last) > limit * 4 else "STOP"
    count = config.get("candidateCount") or 1
    output = estimate_tokens(text) * count
    return {"candidates": [{"index": n, "finishReason": finish,
                            "content": {"role": "model", "parts": [part]}}
                           for n in range(count)],
            "usageMetadata": {"promptTokenCount": prompt_tokens, "candidatesTokenCount": output,
                              "totalTokenCount": prompt_tokens + output},
            "modelVersion": model, "responseId": uuid.uuid4().hex[:20]}


class GeminiJudge:
    """generateContent on both Google paths; shares the judge's stats, faults and key."""

    def __init__(self, judge: Any, limits: RateLimits, issuer: TokenIssuer) -> None:
        self.judge, self.limits, self.issuer = judge, limits, issuer

    def mount(self, app: FastAPI, recorded: Any) -> None:
        app.add_api_route("/v1beta/models/{target}", recorded(self.gemini), methods=["POST"])
        app.add_api_route(
            "/v1/projects/{project}/locations/{location}/publishers/google/models/{target}",
            recorded(self.vertex), methods=["POST"])
        app.add_api_route("/token", self.issuer.token, methods=["POST"])

    async def gemini(self, request: Request) -> Response:
        key = self.judge.api_key
        given = request.headers.get("x-goog-api-key", "")
        if "key" in request.query_params or (key is not None and not hmac.compare_digest(
                given.encode(), key.encode())):
            self.judge.stats.requests_total += 1
            return google_error(401, "API key not valid. Please pass a valid API key "
                                     "(x-goog-api-key).")
        return await self._generate(request, request.path_params["target"])

    async def vertex(self, request: Request) -> Response:
        params = request.path_params
        if not self.issuer.valid(request.headers.get("authorization", "")):
            self.judge.stats.requests_total += 1
            return google_error(401, "Request had invalid authentication credentials. "
                                     "Expected OAuth 2 access token.")
        if params["project"] != self.issuer.project or not params["location"]:
            self.judge.stats.requests_total += 1
            return google_error(403, f"Permission denied on project {params['project']!r}.")
        return await self._generate(request, params["target"])

    async def _generate(self, request: Request, target: str) -> Response:
        judge = self.judge
        judge.stats.requests_total += 1
        if not target.endswith(METHOD) or target == METHOD:
            return google_error(404, f"{target!r} is not a model method this server serves.")
        try:
            body = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError):
            body = None
        problem = request_problem(body)
        if problem is not None:
            return google_error(400, problem)
        fault = judge.faults.draw()
        if fault in ("429", "500", "529"):
            return (exhausted(REQUESTS, judge.faults.retry_after_s) if fault == "429"
                    else google_error(500 if fault == "500" else 503, "simulated fault"))
        if fault == "reset":
            return fault_modes.reset()
        prompt = estimate_tokens(prompt_text(body))
        reserved = (body.get("generationConfig") or {}).get("maxOutputTokens") or \
            judge.default_max_tokens
        decision = self.limits.try_admit(prompt + reserved)
        stats = judge.stats
        if not decision.admitted:
            stats.rejected_429 += 1
            stats.limited_by[decision.limited_by or REQUESTS] += 1
            return exhausted(decision.limited_by or REQUESTS, decision.wait_s)
        stats.record_admitted(body, prompt + reserved)
        stats.input_tokens_admitted += prompt
        stats.output_tokens_admitted += reserved
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
        answer = simulated_answer(body, target.removesuffix(METHOD), prompt)
        used = answer["usageMetadata"]["candidatesTokenCount"]
        stats.record_usage({"prompt_tokens": prompt, "completion_tokens": used})
        if judge.reconcile and reserved > used:
            stats.tokens_refunded += reserved - used
            self.limits.settle(reserved - used)
        return JSONResponse(answer)

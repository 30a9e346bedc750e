"""The strict provider's Azure OpenAI face: Azure's paths, api-version, auth, 429s and answers.

Routes, as Azure OpenAI serves them:

- POST /openai/deployments/{deployment}/{chat/completions,completions,embeddings}
  ?api-version=V, V the one the server was started with (QUOTAFLOW_MOCK_AZURE_API_VERSION);
- POST /openai/v1/{chat/completions,completions,embeddings}, with no api-version or
  `preview` (Azure's v1 API);
- GET /msi/token?api-version=2019-08-01&resource=https://cognitiveservices.azure.com,
  an App Service managed identity endpoint (X-IDENTITY-HEADER must be the server's key):
  point azure-identity at it with IDENTITY_ENDPOINT and IDENTITY_HEADER and its
  DefaultAzureCredential fetches real bearer tokens from it;
- GET /azure/stats: how each request authenticated, and what was refused why.

A request must carry `api-key` (the server's key, where it has one) or `Authorization:
Bearer` with a token this server issued and that has not expired; OpenAI's `Bearer KEY`
is Azure's 401. Requests are judged by the same buckets as the OpenAI routes (judge.py),
and refused with Azure's 429: `{"error": {"code": "429", "message": "... Please retry after
N seconds ..."}}` with retry-after, retry-after-ms and x-ratelimit-remaining-*. Answers
are OpenAI's bodies with Azure's content filter results and apim-request-id.
"""

import hmac
import math
import secrets
import time
import uuid
from collections import Counter
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from mock_provider.buckets import REQUESTS, Decision
from mock_provider.judge import Judge
from mock_provider.record import Recorder
from mock_provider.wire import retry_headers
from quotaflow.constants import ENDPOINT_CHAT, ENDPOINT_COMPLETIONS, ENDPOINT_EMBEDDINGS

OPERATIONS = {"chat/completions": (ENDPOINT_CHAT, "ChatCompletions_Create"),
              "completions": (ENDPOINT_COMPLETIONS, "Completions_Create"),
              "embeddings": (ENDPOINT_EMBEDDINGS, "Embeddings_Create")}
RESOURCE = "https://cognitiveservices.azure.com"
IDENTITY_API_VERSION = "2019-08-01"
V1_API_VERSIONS = frozenset({"preview", "latest"})
TOKEN_TTL_S = 3600
UNAUTHORIZED = ("Access denied due to invalid subscription key or wrong API endpoint. Make "
                "sure to provide a valid key for an active subscription and use a correct "
                "regional API endpoint for your resource.")
_FILTERED_NOTHING = {kind: {"filtered": False, "severity": "safe"}
                     for kind in ("hate", "self_harm", "sexual", "violence")}


def azure_error(status: int, code: str, message: str,
                headers: dict[str, str] | None = None) -> JSONResponse:
    """Azure's error envelope: `code` a string (the status itself for 401 and 429)."""
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status,
                        headers={**(headers or {}), "apim-request-id": str(uuid.uuid4())})


class AzureWire:
    """Azure's dialect of the judged request (judge.Dialect), and its routes."""

    def __init__(self, judge: Judge, api_key: str | None, api_version: str,
                 recorder: Recorder | None = None) -> None:
        self.judge = judge
        self.recorder = recorder
        self.api_key = api_key
        self.api_version = api_version
        self.tokens: dict[str, float] = {}  # issued bearer token -> its expiry (epoch s)
        self.seen: Counter[str] = Counter()  # "api-key", "entra", "refused:<why>"

    def mount(self, app: FastAPI) -> None:
        app.add_api_route("/openai/deployments/{deployment}/{operation:path}",
                          self.deployment_route, methods=["POST"])
        app.add_api_route("/openai/v1/{operation:path}", self.v1_route, methods=["POST"])
        app.add_api_route("/msi/token", self.token_route, methods=["GET"])
        app.add_api_route("/azure/stats", self.stats_route, methods=["GET"])

    async def deployment_route(self, deployment: str, operation: str, request: Request
                               ) -> Response:
        if self.recorder is not None:  # everything that came, refused or not
            await self.recorder.record(request)
        version = request.query_params.get("api-version")
        if version is None:
            return self._refused("no-api-version", 404, "404", "Resource not found")
        if version != self.api_version:
            return self._refused("api-version", 400, "BadRequest",
                                 "API version not supported")
        return await self._judged(operation, request)

    async def v1_route(self, operation: str, request: Request) -> Response:
        if self.recorder is not None:
            await self.recorder.record(request)
        version = request.query_params.get("api-version")
        if version is not None and version not in V1_API_VERSIONS:
            return self._refused("api-version", 400, "BadRequest",
                                 f"api-version {version!r} is not supported on /openai/v1; "
                                 "leave it out or use 'preview'")
        return await self._judged(operation, request)

    async def _judged(self, operation: str, request: Request) -> Response:
        if operation not in OPERATIONS:
            return self._refused("operation", 404, "404", "Resource not found")
        return await self.judge.handle(OPERATIONS[operation][0], request, self)

    async def token_route(self, request: Request) -> Response:
        """An App Service managed identity endpoint, as azure-identity calls it."""
        given = request.headers.get("x-identity-header", "")
        if self.api_key is None or not hmac.compare_digest(given.encode(),
                                                           self.api_key.encode()):
            return self._refused("identity-header", 401, "Unauthorized",
                                 "X-IDENTITY-HEADER is missing or wrong")
        query = request.query_params
        if query.get("api-version") != IDENTITY_API_VERSION or query.get("resource") != RESOURCE:
            return self._refused("token-request", 400, "BadRequest",
                                 f"expected api-version={IDENTITY_API_VERSION} and "
                                 f"resource={RESOURCE}")
        token, expires_on = f"eyJ{secrets.token_urlsafe(32)}", int(time.time()) + TOKEN_TTL_S
        self.tokens[token] = expires_on
        self.seen["tokens-issued"] += 1
        return JSONResponse({"access_token": token, "expires_on": str(expires_on),
                             "resource": RESOURCE, "token_type": "Bearer"})

    async def stats_route(self) -> dict[str, Any]:
        return dict(self.seen)

    def authorized(self, request: Request) -> bool:
        key = request.headers.get("api-key")
        if key is not None:
            good = self.api_key is None or hmac.compare_digest(key.encode(),
                                                               self.api_key.encode())
            self.seen["api-key" if good else "refused:api-key"] += 1
            return good
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        good = scheme == "Bearer" and self.tokens.get(token, 0) > time.time()
        self.seen["entra" if good else "refused:bearer"] += 1
        return good

    def unauthorized(self) -> Response:
        return azure_error(401, "401", UNAUTHORIZED)

    def rate_limited(self, url: str, decision: Decision, cost: int) -> Response:
        kind = "call" if decision.limited_by == REQUESTS else "token"
        operation = next(name for u, name in OPERATIONS.values() if u == url)
        seconds = max(1, math.ceil(decision.wait_s))
        message = (f"Requests to the {operation} Operation under Azure OpenAI API "
                   f"version {self.api_version} have exceeded {kind} rate limit of your "
                   f"current AIServices S0 pricing tier. Please retry after {seconds} "
                   f"second{'s' if seconds != 1 else ''}. Please contact Azure support "
                   "service if you would like to further increase the default rate limit.")
        return azure_error(429, "429", message, {**self._limit_headers(decision),
                                                 **retry_headers(decision)})

    def answered(self, url: str, answer: dict[str, Any], decision: Decision) -> Response:
        if url == ENDPOINT_CHAT:
            answer["prompt_filter_results"] = [
                {"prompt_index": 0, "content_filter_results": _FILTERED_NOTHING}]
            for choice in answer.get("choices") or ():
                choice["content_filter_results"] = _FILTERED_NOTHING
        request_id = str(uuid.uuid4())
        return JSONResponse(answer, headers={
            **self._limit_headers(decision), "apim-request-id": request_id,
            "x-request-id": request_id, "x-ms-region": "Sweden Central"})

    def _limit_headers(self, decision: Decision) -> dict[str, str]:
        return {"x-ratelimit-remaining-requests": str(max(0, math.floor(
                    decision.remaining_requests))),
                "x-ratelimit-remaining-tokens": str(max(0, math.floor(
                    decision.remaining_tokens)))}

    def _refused(self, why: str, status: int, code: str, message: str) -> Response:
        self.seen[f"refused:{why}"] += 1
        return azure_error(status, code, message)

"""The strict provider as a FastAPI app: the judge's routes and the test controls.

Besides the five model endpoints it serves what a test needs to read and steer
the judge from outside its process: GET /stats and POST /stats/reset, PUT
/faults (a deployment that starts failing mid-run) and GET /healthz. FastAPI
costs two to three times the unlimited server's CPU per request (docs/benchmarks.md,
"The provider's share") and buys validation of these controls; where a judge's
limits are the point, its speed is not.
"""

import json
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from mock_provider import message_batches
from mock_provider.azure import AzureWire
from mock_provider.azure_batches import AzureBatches
from mock_provider.bedrock import BedrockJudge
from mock_provider.bedrock_checks import AwsKey
from mock_provider.buckets import RateLimits
from mock_provider.faults import Faults
from mock_provider.gemini import GeminiJudge
from mock_provider.google_token import TokenIssuer
from mock_provider.judge import Judge
from mock_provider.messages import MessagesJudge, SplitLimits
from mock_provider.record import Recorder
from mock_provider.shapes import chat_problem
from mock_provider.stats import Stats
from mock_provider.wire import error_body, json_response
from quotaflow.constants import ENDPOINT_CHAT, ENDPOINT_MESSAGES, ENDPOINTS
from quotaflow.errors import ConfigError


def _validate(
    rpm: int, tpm: int, latency_ms: float, burst_seconds: float, default_max_tokens: int
) -> None:
    for name, value in (
        ("rpm", rpm),
        ("tpm", tpm),
        ("burst_seconds", burst_seconds),
        ("default_max_tokens", default_max_tokens),
    ):
        if not value > 0:
            raise ConfigError(f"mock provider: {name} must be greater than 0, got {value!r}")
    if latency_ms < 0:
        raise ConfigError(f"mock provider: latency_ms must be 0 or more, got {latency_ms!r}")
    if rpm * burst_seconds / 60 < 1:
        raise ConfigError(
            f"mock provider: rpm x burst_seconds / 60 = {rpm * burst_seconds / 60:g} holds "
            "less than one request, so nothing could ever be admitted; raise rpm or burst_seconds"
        )


def create_app(
    rpm: int,
    tpm: int,
    latency_ms: float = 0,
    burst_seconds: float = 60,
    default_max_tokens: int = 256,
    api_key: str | None = None,
    reconcile: bool = True,
    faults: Faults | None = None,
    itpm: int | None = None,
    otpm: int | None = None,
    batch_seconds: float = 1.0,
    record: str | None = None,
    latency_jitter_ms: float = 0.0,
    google_service_account: str | None = None,
    aws_key: AwsKey | None = None,
    azure_api_version: str = "2024-10-21",
) -> FastAPI:
    """The mock provider app; its buckets start full. Serve it from one process.

    With `reconcile`, a request is admitted at its estimate (prompt + max_tokens)
    and then billed its real usage, the unused part refunded; without, the
    estimate is final. /v1/messages (Anthropic's) holds requests, input tokens (itpm)
    and output tokens (otpm) apart; without itpm and otpm, each is limited to tpm.
    With `record` (a path), every model request's body is appended there (record.py).
    Google's generateContent (gemini.py) shares the requests and tokens buckets; Vertex AI's
    tokens come from `google_service_account`'s key file (google_token.py).
    Bedrock's /model/{modelId}/converse and /invoke check SigV4 signatures with `aws_key`
    (bedrock.py; without one, any signature passes) under their own rpm and tpm buckets.
    Azure OpenAI's paths (azure.py) are judged by the same buckets.
    """
    _validate(rpm, tpm, latency_ms, burst_seconds, default_max_tokens)
    limits = RateLimits(rpm, tpm, burst_seconds)
    judge = Judge(rpm, tpm, limits, latency_ms, default_max_tokens, api_key, reconcile, faults)
    judge.jitter_s = latency_jitter_ms / 1000
    app = FastAPI(title="quotaflow mock provider (simulated)")
    app.state.judge = judge
    recorder = Recorder(record) if record else None
    for url in ENDPOINTS:
        app.add_api_route(url, _model_route(judge, url, recorder), methods=["POST"])
    messages = MessagesJudge(judge, SplitLimits(rpm, itpm or tpm, otpm or tpm, burst_seconds))
    app.add_api_route(ENDPOINT_MESSAGES, _recorded(messages.handle, recorder), methods=["POST"])
    message_batches.MessageBatches(api_key, batch_seconds).mount(app)
    GeminiJudge(judge, limits, TokenIssuer(google_service_account)).mount(
        app, lambda route: _recorded(route, recorder))
    BedrockJudge(judge, RateLimits(rpm, tpm, burst_seconds), aws_key).mount(
        app, lambda route: _recorded(route, recorder))
    azure = AzureWire(judge, api_key, azure_api_version, recorder)
    azure.mount(app)
    AzureBatches(azure, batch_seconds).mount(app)

    # async on purpose: all state is touched from the event loop only, never a threadpool.
    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        return {**judge.stats.as_json(), "faults": dict(judge.faults.seen),
                "cache_write_tokens": messages.cache.writes,
                "cache_read_tokens": messages.cache.reads}

    @app.post("/stats/reset")
    async def reset_stats() -> dict[str, Any]:
        judge.stats = Stats()
        messages.cache.writes = messages.cache.reads = 0
        return judge.stats.as_json()

    @app.put("/faults")
    async def set_faults(fractions: dict[str, float]) -> JSONResponse:
        """Change the fault fractions while running: a deployment that starts failing."""
        try:
            judge.faults = Faults.from_fractions(fractions, judge.faults.seen,
                                                 judge.faults.retry_after_s)
        except ValueError as exc:
            return json_response(422, error_body(str(exc), "invalid_request_error", None))
        return json_response(200, judge.faults.fractions())

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def _model_route(judge: Judge, url: str, recorder: Recorder | None
                 ) -> Callable[[Request], Awaitable[Response]]:
    async def model_route(request: Request) -> Response:
        if url == ENDPOINT_CHAT:  # a body in Anthropic's shape: the 400 a real server answers
            body = await request.body()
            try:
                parsed = json.loads(body)
            except (ValueError, UnicodeDecodeError):
                parsed = None
            problem = chat_problem(parsed) if isinstance(parsed, dict) else None
            if problem is not None:
                return json_response(400, error_body(problem, "invalid_request_error", None))
        return await judge.handle(url, request)

    return _recorded(model_route, recorder)


def _recorded(route: Callable[[Request], Awaitable[Response]], recorder: Recorder | None
              ) -> Callable[[Request], Awaitable[Response]]:
    if recorder is None:
        return route

    async def recorded(request: Request) -> Response:
        await recorder.record(request)
        return await route(request)

    return recorded

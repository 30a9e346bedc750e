"""The unlimited provider: admits everything, at the least CPU per request.

Throughput benchmarks (bench/e2e.py) run the provider on the machine they
measure, so every microsecond it spends is taken from quotaflow. This server
is therefore a raw ASGI app, with no FastAPI routing, validation or response
classes: it answers the strict provider's simulated bodies, keeps no buckets,
sends no x-ratelimit-* headers, injects no faults, and counts just enough for
GET /stats to read like the strict judge's. The strict judge shares none of
its shortcuts.
"""

import asyncio
import hmac
import json
from typing import Any

from starlette.types import Receive, Scope, Send

from mock_provider.stats import LeanStats
from mock_provider.wire import UNAUTHORIZED, UNPARSABLE, error_body, request_id
from quotaflow.constants import ENDPOINTS
from quotaflow.errors import ConfigError
from quotaflow.providers.mock import simulated_body

_JSON_HEADERS = ((b"content-type", b"application/json"),)
_MODEL_PATHS = frozenset(ENDPOINTS)


class LeanProvider:
    """Raw ASGI app: POST to each of the endpoints (constants.ENDPOINTS) answers
    simulated bodies at once (or after `latency_ms`); GET /stats, POST /stats/reset,
    GET /healthz. Every request is admitted: no buckets, no faults."""

    def __init__(self, latency_ms: float = 0.0, api_key: str | None = None) -> None:
        if latency_ms < 0:
            raise ConfigError(f"mock provider: latency_ms must be 0 or more, got {latency_ms!r}")
        self.latency_s = latency_ms / 1000
        self._authorization = None if api_key is None else f"Bearer {api_key}".encode()
        self.stats = LeanStats()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if path in _MODEL_PATHS and method == "POST":
            status, payload = await self._model(path, scope, receive)
        elif path == "/healthz" and method == "GET":
            status, payload = 200, {"status": "ok"}
        elif path == "/stats" and method == "GET":
            status, payload = 200, self.stats.as_json()
        elif path == "/stats/reset" and method == "POST":
            self.stats = LeanStats()
            status, payload = 200, self.stats.as_json()
        else:
            status, payload = 404, error_body(f"no route {method} {path} (unlimited mock)",
                                              "invalid_request_error", None)
        content = json.dumps(payload, separators=(",", ":")).encode()
        await send({"type": "http.response.start", "status": status, "headers": [
            *_JSON_HEADERS, (b"content-length", str(len(content)).encode()),
            (b"x-request-id", request_id().encode())]})
        await send({"type": "http.response.body", "body": content})

    async def _model(self, url: str, scope: Scope,
                     receive: Receive) -> tuple[int, dict[str, Any]]:
        stats = self.stats  # a reset during the latency sleep must not split this request
        stats.requests_total += 1
        raw = await _read_body(receive)
        if self._authorization is not None and not self._authorized(scope):
            return 401, error_body(UNAUTHORIZED, "invalid_request_error", "invalid_api_key")
        try:
            body = json.loads(raw)
            answer = simulated_body(url, body) if isinstance(body, dict) else None
        except (ValueError, UnicodeDecodeError, AttributeError, TypeError):
            answer = None
        if answer is None:
            return 400, error_body(UNPARSABLE, "invalid_request_error", None)
        stats.record_admitted(raw, answer.get("usage") or {})  # moderations have none
        if self.latency_s > 0:
            await asyncio.sleep(self.latency_s)
        return 200, answer

    def _authorized(self, scope: Scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                return hmac.compare_digest(value, self._authorization or b"")
        return False


async def _read_body(receive: Receive) -> bytes:
    message = await receive()
    body: bytes = message.get("body", b"")
    if not message.get("more_body"):
        return body
    chunks = [body]
    while message.get("more_body"):
        message = await receive()
        chunks.append(message.get("body", b""))
    return b"".join(chunks)


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return

"""Per-key request limits: one tenant's script cannot starve everyone else's reads.

Each API key (the one the request presents, `Authorization: Bearer` or `x-api-key`; a
request without one: its client address) may make QUOTAFLOW_API_RATE_LIMIT requests per
window. The count lives in Redis (the limiter's, QUOTAFLOW_REDIS_URL or the broker), so
every API process of the cluster shares it. A fixed window aligned to the clock: the
window's allowance may be spent at once (the burst), and when it ends is known without
asking Redis, so a request costs one round trip (one INCR through the `limits` library's
Redis storage) and its answer carries the IETF draft's headers:

    RateLimit-Limit: 100            RateLimit-Remaining: 42
    RateLimit-Reset: 7              (seconds until the window ends)
    RateLimit-Policy: 100;w=10

Over the limit: 429 with `Retry-After` and the same headers, in the API's error shape
(Anthropic's under /v1/messages/). The key is counted by its SHA-256, never stored.
/healthz and /metrics are never limited. When Redis cannot be reached the limit is not
enforced (logged once, asked again every few seconds): an outage of the counter must
not become an outage of the API.
"""

import contextlib
import hashlib
import logging
import math
import time
from dataclasses import dataclass
from typing import cast

from limits import RateLimitItem
from limits import parse as parse_rate
from limits.aio.storage import Storage
from limits.errors import StorageError
from limits.storage import storage_from_string
from redis.exceptions import RedisError
from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.anthropic_errors import PATH_PREFIX, reshape
from api.errors import error_response
from quotaflow.config import Settings, get_settings

log = logging.getLogger("quotaflow.api")

EXEMPT = frozenset({"/healthz", "/metrics"})
REDIS_TIMEOUT_S = 0.5  # a counter slower than this is treated as away
RETRY_REDIS_S = 5.0  # while it is away, ask again this often (not on every request)
_SCHEMES = {"redis": "async+redis", "rediss": "async+rediss",
            "redis+cluster": "async+redis+cluster", "rediss+cluster": "async+redis+cluster"}


@dataclass(frozen=True)
class Count:
    """Where one request leaves its key's window."""

    limit: int
    used: int
    window_s: int
    reset_s: int

    @property
    def allowed(self) -> bool:
        return self.used <= self.limit

    def headers(self) -> dict[str, str]:
        return {"RateLimit-Limit": str(self.limit),
                "RateLimit-Remaining": str(max(0, self.limit - self.used)),
                "RateLimit-Reset": str(self.reset_s),
                "RateLimit-Policy": f"{self.limit};w={self.window_s}"}


def who(scope: Scope) -> str:
    """The bucket a request counts against: its key's digest, else its client address."""
    headers = Headers(scope=scope)
    scheme, _, credential = headers.get("authorization", "").partition(" ")
    key = credential.strip() if scheme.lower() == "bearer" else ""
    key = key or headers.get("x-api-key", "").strip()
    if key:
        return "key:" + hashlib.sha256(key.encode()).hexdigest()[:32]
    client = scope.get("client")
    return "addr:" + (client[0] if client else "unknown")


def storage_for(url: str) -> Storage:
    """`limits`' async Redis storage for a Redis (or Redis Cluster) URL as quotaflow names it."""
    scheme, sep, rest = url.partition("://")
    options: dict[str, float | bool] = {"socket_timeout": REDIS_TIMEOUT_S,
                                        "socket_connect_timeout": REDIS_TIMEOUT_S}
    if scheme == "rediss+cluster":
        options["ssl"] = True
    # An async+ scheme (_SCHEMES): the async storage.
    return cast(Storage, storage_from_string(_SCHEMES.get(scheme, scheme) + sep + rest,
                                             implementation="redispy", wrap_exceptions=True,
                                             **options))


class Meter:
    """Counts requests per key in Redis, one INCR each; None when Redis is away."""

    def __init__(self, item: RateLimitItem, url: str) -> None:
        self.item, self.url = item, url
        self._storage: Storage | None = None  # made in the serving event loop
        self._away_until = 0.0

    async def hit(self, bucket: str) -> Count | None:
        now = time.time()
        if now < self._away_until:
            return None
        window = self.item.get_expiry()
        index = int(now // window)
        try:
            if self._storage is None:
                self._storage = storage_for(self.url)
            used = await self._storage.incr(f"quotaflow:api:{bucket}:{index}", window + 1)
        except (StorageError, RedisError, OSError, TimeoutError) as exc:
            if not self._away_until:
                log.warning("API rate limits not enforced: their Redis cannot be reached "
                            "(%s); retried every %.0f s", exc.__class__.__name__, RETRY_REDIS_S)
            self._away_until = now + RETRY_REDIS_S
            return None
        if self._away_until:
            log.warning("API rate limits enforced again: their Redis answers")
            self._away_until = 0.0
        reset = max(1, math.ceil((index + 1) * window - now))
        return Count(self.item.amount, int(used), window, reset)


    async def close(self) -> None:
        """Close the connections of the event loop ending (the app's shutdown)."""
        storage, self._storage = self._storage, None
        if storage is not None:
            with contextlib.suppress(Exception):  # a Redis already away has nothing to close
                # The redispy bridge of limits' async Redis storages, which Storage lacks.
                await storage.bridge.get_connection().aclose()  # type: ignore[attr-defined]


def meter_for(settings: Settings) -> Meter | None:
    """The settings' meter; None when the limit is off or there is no Redis to count in."""
    if settings.api_rate_limit is None or settings.limiter_url is None:
        return None
    return Meter(parse_rate(settings.api_rate_limit), settings.limiter_url)


def too_many(path: str, count: Count) -> Response:
    """The 429 answer, in the route's error shape."""
    headers = {**count.headers(), "Retry-After": str(count.reset_s)}
    response = error_response(
        429, f"too many requests for this API key: {count.limit} per {count.window_s} s; "
        f"try again in {count.reset_s} s", code="rate_limit_exceeded", headers=headers)
    return reshape(response) if path.startswith(PATH_PREFIX) else response


class RateLimitMiddleware:
    """Counts every HTTP request but /healthz and /metrics; refuses those over the limit."""

    def __init__(self, app: ASGIApp, meter: Meter | None = None) -> None:
        self.app = app
        self._meter = meter
        self._configured = meter is not None

    def meter(self) -> Meter | None:
        if not self._configured:  # the settings are read when the first request comes
            self._meter, self._configured = meter_for(get_settings()), True
        return self._meter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, self._closing(receive), send)
            return
        meter = self.meter() if scope["type"] == "http" else None
        if meter is None or scope["path"] in EXEMPT:
            await self.app(scope, receive, send)
            return
        count = await meter.hit(who(scope))
        if count is None:
            await self.app(scope, receive, send)
            return
        if not count.allowed:
            await too_many(scope["path"], count)(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in count.headers().items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _closing(self, receive: Receive) -> Receive:
        """The lifespan's `receive`, closing the meter's connections at shutdown."""
        async def closing() -> Message:
            message = await receive()
            if message["type"] == "lifespan.shutdown" and self._meter is not None:
                await self._meter.close()
            return message
        return closing

"""A simulated OpenAI-compatible provider that enforces RPM and TPM strictly.

Why it exists: quotaflow promises zero 429s with the budget nearly fully
used, and that promise needs a judge that counts the way OpenAI does. This
server is that judge. It admits a request on arrival only if both of its
buckets (requests and tokens, continuously refilling, capacity = limit x
burst_seconds / 60) hold enough, all-or-nothing, and otherwise answers 429
with OpenAI's error body and x-ratelimit-* / retry-after headers. GET /stats
tells a test how many requests were admitted, refused and repeated.

The buckets are written here on purpose and share no code with
quotaflow/ratelimit.py: a judge built from the code it judges would agree
with its bugs. Admission cost comes from quotaflow.tokens, because that is
how the provider counts, not how quotaflow limits.

Single process by design: the buckets live in this process's memory behind
a lock, so serve it with one uvicorn worker. Several workers would each
enforce the full limit and the judge would be too lenient.

Every answer is simulated (quotaflow.providers.mock.simulated_body sets
system_fingerprint "quotaflow-simulated"); no model is involved.

Unlimited mode (`quotaflow mock-provider --unlimited`, QUOTAFLOW_MOCK_UNLIMITED=1)
is another server for another purpose: a provider that never refuses and costs
as little CPU per request as possible, for throughput benchmarks
(bench/e2e.py) where it shares the machine with what it measures. It is a raw
ASGI app (`LeanProvider`: no FastAPI routing, validation or response classes),
answers the same simulated bodies, keeps no buckets and sends no
x-ratelimit-* headers, and counts requests, usage and repeated bodies (by the
hash of the raw body bytes) for GET /stats. The strict judge above is untouched
by it.
"""

import asyncio
import hmac
import json
import math
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from api import mock_faults
from api.mock_faults import Faults
from quotaflow.constants import ENDPOINTS
from quotaflow.errors import ConfigError
from quotaflow.providers.mock import simulated_body
from quotaflow.tokens import admission_tokens

Clock = Callable[[], float]
T = TypeVar("T", int, float)

# Float refill arithmetic can leave a bucket 1e-12 short of a request that a
# client timed exactly by retry-after-ms; forgive that much, never more.
FIT_EPSILON = 1e-9
REQUESTS = "requests"
TOKENS = "tokens"


class TokenBucket:
    """One continuously refilling bucket. Not thread-safe: RateLimits holds the lock."""

    def __init__(self, limit_per_minute: float, burst_seconds: float, now: float) -> None:
        self.capacity = limit_per_minute * burst_seconds / 60
        self.rate = limit_per_minute / 60
        self._level = self.capacity
        self._updated = now

    def level(self, now: float) -> float:
        """The bucket's content at `now`, after refilling since the last look."""
        elapsed = max(0.0, now - self._updated)
        self._level = min(self.capacity, self._level + elapsed * self.rate)
        self._updated = max(self._updated, now)
        return self._level

    def wait_for(self, amount: float, now: float) -> float:
        """Seconds until `amount` fits: 0 if it fits now, inf if it never can."""
        if amount > self.capacity + FIT_EPSILON:
            return math.inf
        deficit = amount - self.level(now)
        return 0.0 if deficit <= FIT_EPSILON else deficit / self.rate

    def take(self, amount: float, now: float) -> None:
        self._level = self.level(now) - amount

    def give(self, amount: float, now: float) -> None:
        """Return tokens (or charge more, if negative), never above capacity."""
        self._level = min(self.capacity, self.level(now) + amount)

    def until_full(self, now: float) -> float:
        """Seconds until the bucket is full again (OpenAI's x-ratelimit-reset-*)."""
        return max(0.0, (self.capacity - self.level(now)) / self.rate)


@dataclass(frozen=True)
class Decision:
    """The outcome of one admission and the bucket state to report in headers."""

    admitted: bool
    limited_by: str | None  # "requests" or "tokens" when refused
    wait_s: float  # until it would fit; until the token bucket is full if it never can
    never_fits: bool
    remaining_requests: float
    remaining_tokens: float
    reset_requests_s: float
    reset_tokens_s: float


class RateLimits:
    """The requests and tokens buckets of one server, admitted together under one lock."""

    def __init__(
        self, rpm: float, tpm: float, burst_seconds: float, clock: Clock = time.monotonic
    ) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        now = clock()
        self.requests = TokenBucket(rpm, burst_seconds, now)
        self.tokens = TokenBucket(tpm, burst_seconds, now)

    def try_admit(self, tokens: float) -> Decision:
        """Take one request and `tokens` if both fit now; otherwise take nothing."""
        with self._lock:
            now = self._clock()
            waits = {
                REQUESTS: self.requests.wait_for(1, now),
                TOKENS: self.tokens.wait_for(tokens, now),
            }
            limited_by = max(waits, key=lambda kind: waits[kind])
            wait = waits[limited_by]
            admitted = wait == 0.0
            if admitted:
                self.requests.take(1, now)
                self.tokens.take(tokens, now)
            never_fits = math.isinf(wait)
            if never_fits:
                wait = max(self.requests.until_full(now), self.tokens.until_full(now))
            return self._decision(now, admitted, None if admitted else limited_by, wait,
                                  never_fits)

    def settle(self, tokens: float) -> Decision:
        """Charge real usage after the answer: refund the unused part of the admission cost."""
        with self._lock:
            now = self._clock()
            self.tokens.give(tokens, now)
            return self._decision(now, True, None, 0.0, False)

    def _decision(self, now: float, admitted: bool, limited_by: str | None, wait: float,
                  never_fits: bool) -> Decision:
        return Decision(
            admitted=admitted,
            limited_by=limited_by,
            wait_s=wait,
            never_fits=never_fits,
            remaining_requests=self.requests.level(now),
            remaining_tokens=self.tokens.level(now),
            reset_requests_s=self.requests.until_full(now),
            reset_tokens_s=self.tokens.until_full(now),
        )


@dataclass
class Stats:
    """What the server has seen since start or the last reset, for tests to check."""

    requests_total: int = 0
    admitted: int = 0
    rejected_429: int = 0
    tokens_admitted: int = 0
    tokens_refunded: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_admitted_at: float | None = None
    last_admitted_at: float | None = None
    duplicate_bodies: int = 0
    # Admitted calls not yet answered, and the most there ever were at once: how many a
    # crash can catch in flight.
    in_flight: int = 0
    peak_in_flight: int = 0
    calls_per_body: Counter[str] = field(default_factory=Counter)

    def record_admitted(self, body: dict[str, Any], cost: int) -> None:
        key = json.dumps(body, sort_keys=True)
        if self.calls_per_body[key]:
            self.duplicate_bodies += 1
        self.calls_per_body[key] += 1
        self.admitted += 1
        self.tokens_admitted += cost
        now = time.time()
        if self.first_admitted_at is None:
            self.first_admitted_at = now
        self.last_admitted_at = now

    def record_usage(self, usage: dict[str, Any]) -> None:
        self.prompt_tokens += int(usage.get("prompt_tokens", 0))
        self.completion_tokens += int(usage.get("completion_tokens", 0))

    def as_json(self) -> dict[str, Any]:
        fields = {k: v for k, v in vars(self).items() if k != "calls_per_body"}
        return {**fields, "max_calls_per_body": max(self.calls_per_body.values(), default=0)}


def format_reset(seconds: float) -> str:
    """A duration the way OpenAI writes x-ratelimit-reset-*: "120ms", "1.5s", "6m0s"."""
    ms = max(0, math.ceil(seconds * 1000 - 1e-6))  # tolerate float noise such as 0.5000000001
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    minutes, rest_ms = divmod(ms, 60_000)
    hours, minutes = divmod(minutes, 60)
    whole, frac = divmod(rest_ms, 1000)
    secs = f"{whole}.{frac:03d}".rstrip("0") if frac else str(whole)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def error_body(message: str, kind: str, code: str | None) -> dict[str, Any]:
    """OpenAI's error envelope."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _floor(level: float) -> int:
    return max(0, math.floor(level + FIT_EPSILON))


def ratelimit_headers(rpm: int, tpm: int, decision: Decision) -> dict[str, str]:
    """The x-ratelimit-* headers OpenAI sends on every answer."""
    return {
        "x-ratelimit-limit-requests": str(rpm),
        "x-ratelimit-limit-tokens": str(tpm),
        "x-ratelimit-remaining-requests": str(_floor(decision.remaining_requests)),
        "x-ratelimit-remaining-tokens": str(_floor(decision.remaining_tokens)),
        "x-ratelimit-reset-requests": format_reset(decision.reset_requests_s),
        "x-ratelimit-reset-tokens": format_reset(decision.reset_tokens_s),
    }


def _rate_limit_message(decision: Decision, rpm: int, tpm: int, cost: int) -> str:
    kind = decision.limited_by or TOKENS
    unit, limit, requested = ("RPM", rpm, 1) if kind == REQUESTS else ("TPM", tpm, cost)
    if decision.never_fits:
        return (
            f"Request too large for {kind} per min ({unit}) on quotaflow-simulated: "
            f"Limit {limit}, Requested {requested}. It can never be admitted; "
            "lower max_tokens or the prompt, or raise the burst."
        )
    return (
        f"Rate limit reached for {kind} per min ({unit}) on quotaflow-simulated: "
        f"Limit {limit}, Requested {requested}. "
        f"Please try again in {format_reset(decision.wait_s)}."
    )


def _request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


def _json(
    status: int, content: dict[str, Any], headers: dict[str, str] | None = None
) -> JSONResponse:
    all_headers = {**(headers or {}), "x-request-id": _request_id()}
    return JSONResponse(content, status_code=status, headers=all_headers)


class Judge:
    """The server's state and the handling of one model request, top to bottom."""

    def __init__(
        self,
        rpm: int,
        tpm: int,
        limits: RateLimits,
        latency_ms: float,
        default_max_tokens: int,
        api_key: str | None,
        reconcile: bool = True,
        faults: Faults | None = None,
    ) -> None:
        self.rpm, self.tpm = rpm, tpm
        self.reconcile = reconcile
        self.faults = faults or Faults()
        self.limits = limits
        self.latency_s = latency_ms / 1000
        self.default_max_tokens = default_max_tokens
        self._api_key = api_key
        self.stats = Stats()

    def authorized(self, request: Request) -> bool:
        if self._api_key is None:
            return True
        given = request.headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {self._api_key}".encode())

    async def handle(self, url: str, request: Request) -> Response:
        self.stats.requests_total += 1
        if not self.authorized(request):
            message = "Incorrect or missing API key. Send 'Authorization: Bearer <key>'."
            return _json(401, error_body(message, "invalid_request_error", "invalid_api_key"))
        body = await _read_object(request)
        cost = None if body is None else _cost(url, body, self.default_max_tokens)
        if body is None or cost is None:
            message = "We could not parse the JSON body of your request (expected a JSON object)."
            return _json(400, error_body(message, "invalid_request_error", None))
        fault = self.faults.draw()
        if fault in mock_faults.BEFORE_ADMISSION:
            return {"429": mock_faults.storm_429, "500": mock_faults.error_500,
                    "reset": mock_faults.reset}[fault]()
        decision = self.limits.try_admit(cost)
        headers = ratelimit_headers(self.rpm, self.tpm, decision)
        if not decision.admitted:
            self.stats.rejected_429 += 1
            return self._rate_limited(decision, cost, headers)
        stats = self.stats  # a reset during the latency sleep must not split this request
        stats.record_admitted(body, cost)
        stats.in_flight += 1
        stats.peak_in_flight = max(stats.peak_in_flight, stats.in_flight)
        try:
            if self.latency_s > 0:
                await asyncio.sleep(self.latency_s)
            if fault == "hang":
                await mock_faults.hang()
        finally:
            stats.in_flight -= 1
        if fault == "malformed":
            return mock_faults.malformed()
        answer = simulated_body(url, body)
        stats.record_usage(answer["usage"])
        if self.reconcile:
            # Bill real usage: the admission estimate's unused part goes back to the
            # bucket, and the headers describe the buckets as they are now.
            refund = cost - int(answer["usage"].get("total_tokens", cost))
            stats.tokens_refunded += refund
            headers = ratelimit_headers(self.rpm, self.tpm, self.limits.settle(refund))
        return _json(200, answer, headers)

    def _rate_limited(self, decision: Decision, cost: int, headers: dict[str, str]) -> JSONResponse:
        message = _rate_limit_message(decision, self.rpm, self.tpm, cost)
        retry = {
            "retry-after": str(max(1, math.ceil(decision.wait_s))),
            "retry-after-ms": str(max(1, math.ceil(decision.wait_s * 1000))),
        }
        content = error_body(message, decision.limited_by or TOKENS, "rate_limit_exceeded")
        return _json(429, content, {**headers, **retry})


async def _read_object(request: Request) -> dict[str, Any] | None:
    """The request's JSON object, or None when the body is not one."""
    try:
        body = json.loads(await request.body())
    except (ValueError, UnicodeDecodeError):
        return None
    return body if isinstance(body, dict) else None


def _cost(url: str, body: dict[str, Any], default_max_tokens: int) -> int | None:
    """Admission cost, or None when the body's shape cannot be counted (e.g. messages not dicts)."""
    try:
        return admission_tokens(url, body, default_max_tokens)
    except (AttributeError, TypeError):
        return None


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
) -> FastAPI:
    """The mock provider app; its buckets start full. Serve it from one process.

    With `reconcile`, a request is admitted at its estimate (prompt + max_tokens)
    and then billed its real usage, the unused part refunded; without, the
    estimate is final.
    """
    _validate(rpm, tpm, latency_ms, burst_seconds, default_max_tokens)
    limits = RateLimits(rpm, tpm, burst_seconds)
    judge = Judge(rpm, tpm, limits, latency_ms, default_max_tokens, api_key, reconcile, faults)
    app = FastAPI(title="quotaflow mock provider (simulated)")
    app.state.judge = judge
    for url in ENDPOINTS:
        app.add_api_route(url, _model_route(judge, url), methods=["POST"])

    # async on purpose: all state is touched from the event loop only, never a threadpool.
    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        return {**judge.stats.as_json(), "faults": dict(judge.faults.seen)}

    @app.post("/stats/reset")
    async def reset_stats() -> dict[str, Any]:
        judge.stats = Stats()
        return judge.stats.as_json()

    @app.put("/faults")
    async def set_faults(fractions: dict[str, float]) -> JSONResponse:
        """Change the fault fractions while running: a deployment that starts failing."""
        try:
            judge.faults = Faults.from_fractions(fractions, judge.faults.seen)
        except ValueError as exc:
            return _json(422, error_body(str(exc), "invalid_request_error", None))
        return _json(200, judge.faults.fractions())

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def _model_route(judge: Judge, url: str) -> Callable[[Request], Any]:
    async def model_route(request: Request) -> JSONResponse:
        return await judge.handle(url, request)

    return model_route


def _env(name: str, cast: Callable[[str], T], default: T | None = None) -> T:
    raw = os.environ.get(name, "").strip()
    if not raw:
        if default is None:
            raise ConfigError(f"{name} is not set; the mock provider needs it")
        return default
    try:
        return cast(raw)
    except ValueError:
        kind = "a whole number" if cast is int else "a number"
        raise ConfigError(f"{name} must be {kind}, got {raw!r}") from None


def _env_api_key() -> str | None:
    """The key from the variable QUOTAFLOW_MOCK_API_KEY_ENV names; None: no auth."""
    key_var = os.environ.get("QUOTAFLOW_MOCK_API_KEY_ENV", "").strip()
    if not key_var:
        return None
    key = os.environ.get(key_var)
    if not key:
        raise ConfigError(
            f"QUOTAFLOW_MOCK_API_KEY_ENV names {key_var}, but {key_var} is empty or not set"
        )
    return key


def app_from_env() -> "FastAPI | LeanProvider":
    """uvicorn factory: the app configured from QUOTAFLOW_MOCK_* variables; the lean
    unlimited server when QUOTAFLOW_MOCK_UNLIMITED=1 (then RPM/TPM are not read)."""
    if os.environ.get("QUOTAFLOW_MOCK_UNLIMITED", "0") not in ("", "0"):
        return LeanProvider(latency_ms=_env("QUOTAFLOW_MOCK_LATENCY_MS", float, 0.0),
                            api_key=_env_api_key())
    return create_app(
        rpm=_env("QUOTAFLOW_MOCK_RPM", int),
        tpm=_env("QUOTAFLOW_MOCK_TPM", int),
        latency_ms=_env("QUOTAFLOW_MOCK_LATENCY_MS", float, 0.0),
        burst_seconds=_env("QUOTAFLOW_MOCK_BURST_SECONDS", float, 60.0),
        default_max_tokens=_env("QUOTAFLOW_MOCK_DEFAULT_MAX_TOKENS", int, 256),
        api_key=_env_api_key(),
        reconcile=os.environ.get("QUOTAFLOW_MOCK_RECONCILE", "1") != "0",
        faults=_env_faults(),
    )


def _env_faults() -> Faults:
    try:
        return Faults.from_env()
    except ValueError as exc:
        raise ConfigError(f"mock provider: {exc}") from exc


# --- unlimited mode: a lean provider for throughput benchmarks ----------------------------------

_JSON_HEADERS = ((b"content-type", b"application/json"),)
_MODEL_PATHS = frozenset(ENDPOINTS)


@dataclass
class LeanStats:
    """What the unlimited server has seen; kept to a few integer additions per request.

    Repeats are counted by the hash of the raw body bytes, not of a canonical form of
    the JSON: a client that sends one request twice sends the same bytes, and hashing
    bytes costs far less than sorting and serialising the body again. Python's 64-bit
    hash makes a false repeat among a million bodies about a 1-in-10^7 event.
    """

    requests_total: int = 0
    admitted: int = 0
    rejected_429: int = 0  # never, by design; kept so /stats reads like the strict judge's
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_admitted_at: float | None = None
    last_admitted_at: float | None = None
    duplicate_bodies: int = 0
    calls_per_body: dict[int, int] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        fields = {k: v for k, v in vars(self).items() if k != "calls_per_body"}
        return {**fields, "max_calls_per_body": max(self.calls_per_body.values(), default=0),
                "unlimited": True}


class LeanProvider:
    """Raw ASGI app: POST /v1/chat/completions, /v1/completions, /v1/embeddings answer
    simulated bodies at once (or after `latency_ms`); GET /stats, POST /stats/reset,
    GET /healthz. Every request is admitted: no buckets, no faults."""

    def __init__(self, latency_ms: float = 0.0, api_key: str | None = None) -> None:
        if latency_ms < 0:
            raise ConfigError(f"mock provider: latency_ms must be 0 or more, got {latency_ms!r}")
        self.latency_s = latency_ms / 1000
        self._authorization = None if api_key is None else f"Bearer {api_key}".encode()
        self.stats = LeanStats()

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Any],
                       send: Callable[[dict[str, Any]], Any]) -> None:
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
            (b"x-request-id", _request_id().encode())]})
        await send({"type": "http.response.body", "body": content})

    async def _model(self, url: str, scope: dict[str, Any],
                     receive: Callable[[], Any]) -> tuple[int, dict[str, Any]]:
        stats = self.stats  # a reset during the latency sleep must not split this request
        stats.requests_total += 1
        raw = await _read_body(receive)
        if self._authorization is not None and not self._authorized(scope):
            message = "Incorrect or missing API key. Send 'Authorization: Bearer <key>'."
            return 401, error_body(message, "invalid_request_error", "invalid_api_key")
        try:
            body = json.loads(raw)
            answer = simulated_body(url, body) if isinstance(body, dict) else None
        except (ValueError, UnicodeDecodeError, AttributeError, TypeError):
            answer = None
        if answer is None:
            message = "We could not parse the JSON body of your request (expected a JSON object)."
            return 400, error_body(message, "invalid_request_error", None)
        key = hash(raw)
        calls = stats.calls_per_body.get(key, 0)
        stats.calls_per_body[key] = calls + 1
        stats.duplicate_bodies += calls > 0
        stats.admitted += 1
        now = time.time()
        if stats.first_admitted_at is None:
            stats.first_admitted_at = now
        stats.last_admitted_at = now
        usage = answer["usage"]
        stats.prompt_tokens += usage.get("prompt_tokens", 0)
        stats.completion_tokens += usage.get("completion_tokens", 0)
        if self.latency_s > 0:
            await asyncio.sleep(self.latency_s)
        return 200, answer

    def _authorized(self, scope: dict[str, Any]) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                return hmac.compare_digest(value, self._authorization or b"")
        return False


async def _read_body(receive: Callable[[], Any]) -> bytes:
    message = await receive()
    body = message.get("body", b"")
    if not message.get("more_body"):
        return body
    chunks = [body]
    while message.get("more_body"):
        message = await receive()
        chunks.append(message.get("body", b""))
    return b"".join(chunks)


async def _lifespan(receive: Callable[[], Any], send: Callable[[dict[str, Any]], Any]) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return

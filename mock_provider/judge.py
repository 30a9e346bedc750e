"""The strict provider's handling of one model request, from key check to answer.

quotaflow promises zero 429s with the budget nearly fully used, and that promise
needs a judge that counts the way OpenAI does: admission on arrival at the
request's estimated cost (prompt + max_tokens, from quotaflow.budget.tokens, because
that is how the provider counts, not how quotaflow limits), then, with
`reconcile`, billing the real usage and refunding the rest. Every answer is
simulated (quotaflow.providers.mock); no model is involved.

All state is touched from the event loop only, never from a threadpool, so the
counters need no lock; the buckets keep their own.
"""

import asyncio
import hmac
import json
import random
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from mock_provider import faults as fault_modes
from mock_provider.buckets import TOKENS, Decision, RateLimits
from mock_provider.faults import Faults
from mock_provider.stats import Stats
from mock_provider.wire import (
    UNAUTHORIZED,
    UNPARSABLE,
    error_body,
    json_response,
    rate_limit_message,
    ratelimit_headers,
    retry_headers,
)
from quotaflow.budget.tokens import admission_tokens
from quotaflow.providers.mock import simulated_body


class Dialect(Protocol):
    """How a provider other than OpenAI speaks the same judged request (mock_provider/azure.py):
    its auth, its 401, its 429 and its answers' headers; the buckets are the judge's."""

    def authorized(self, request: Request) -> bool: ...

    def unauthorized(self) -> Response: ...

    def rate_limited(self, url: str, decision: Decision, cost: int) -> Response: ...

    def answered(self, url: str, answer: dict[str, Any], decision: Decision) -> Response: ...


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
        self.jitter_s = 0.0  # a further 0..jitter_s of latency per answer, at random
        self.default_max_tokens = default_max_tokens
        self._api_key = api_key
        self.stats = Stats()

    @property
    def api_key(self) -> str | None:
        """The key clients must send (Bearer, or x-api-key on /v1/messages); None: any."""
        return self._api_key

    def authorized(self, request: Request) -> bool:
        if self._api_key is None:
            return True
        given = request.headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {self._api_key}".encode())

    async def handle(self, url: str, request: Request, dialect: Dialect | None = None
                     ) -> Response:
        """Judge one request to `url` (an OpenAI endpoint, whatever path it came by),
        answering in OpenAI's wire format or the dialect's."""
        self.stats.requests_total += 1
        if dialect is not None and not dialect.authorized(request):
            return dialect.unauthorized()
        if dialect is None and not self.authorized(request):
            return json_response(
                401, error_body(UNAUTHORIZED, "invalid_request_error", "invalid_api_key"))
        body = await _read_object(request)
        cost = None if body is None else _cost(url, body, self.default_max_tokens)
        if body is None or cost is None:
            return json_response(400, error_body(UNPARSABLE, "invalid_request_error", None))
        fault = self.faults.draw()
        if fault is not None and fault in fault_modes.BEFORE_ADMISSION:
            return fault_modes.refusal(fault, self.faults.retry_after_s)
        decision = self.limits.try_admit(cost)
        headers = ratelimit_headers(self.rpm, self.tpm, decision)
        if not decision.admitted:
            self.stats.rejected_429 += 1
            if dialect is not None:
                return dialect.rate_limited(url, decision, cost)
            return self._rate_limited(decision, cost, headers)
        stats = self.stats  # a reset during the latency sleep must not split this request
        stats.record_admitted(body, cost)
        stats.in_flight += 1
        stats.peak_in_flight = max(stats.peak_in_flight, stats.in_flight)
        try:
            if self.latency_s > 0 or self.jitter_s > 0:
                await asyncio.sleep(self.latency_s + random.uniform(0, self.jitter_s))
            if fault == "hang":
                await fault_modes.hang()
        finally:
            stats.in_flight -= 1
        if fault == "malformed":
            return fault_modes.malformed()
        answer = simulated_body(url, body)
        usage = answer.get("usage") or {}  # a moderation has none: its admission stands
        stats.record_usage(usage)
        if self.reconcile:
            # Bill real usage: the admission estimate's unused part goes back to the
            # bucket, and the headers describe the buckets as they are now.
            refund = cost - int(usage.get("total_tokens", cost))
            stats.tokens_refunded += refund
            decision = self.limits.settle(refund)
            headers = ratelimit_headers(self.rpm, self.tpm, decision)
        if dialect is not None:
            return dialect.answered(url, answer, decision)
        return json_response(200, answer, headers)

    def _rate_limited(self, decision: Decision, cost: int, headers: dict[str, str]) -> JSONResponse:
        message = rate_limit_message(decision, self.rpm, self.tpm, cost)
        content = error_body(message, decision.limited_by or TOKENS, "rate_limit_exceeded")
        return json_response(429, content, {**headers, **retry_headers(decision)})


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

"""How the mock provider's answers look on the wire: OpenAI's error envelope, its
x-ratelimit-* headers and their duration format, its 429 messages, its request ids.

Clients (quotaflow's workers and the OpenAI SDK alike) parse these byte for byte
to decide when to retry, so they are copied from what OpenAI sends rather than
designed; a client tested against a friendlier format would fail against the
real provider.
"""

import math
import uuid
from typing import Any

from fastapi.responses import JSONResponse

from mock_provider.buckets import FIT_EPSILON, REQUESTS, TOKENS, Decision

UNAUTHORIZED = "Incorrect or missing API key. Send 'Authorization: Bearer <key>'."
UNPARSABLE = "We could not parse the JSON body of your request (expected a JSON object)."


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


def retry_headers(decision: Decision) -> dict[str, str]:
    """retry-after (whole seconds, at least 1) and OpenAI's finer retry-after-ms."""
    return {
        "retry-after": str(max(1, math.ceil(decision.wait_s))),
        "retry-after-ms": str(max(1, math.ceil(decision.wait_s * 1000))),
    }


def rate_limit_message(decision: Decision, rpm: int, tpm: int, cost: int) -> str:
    """The 429's message: which limit, how much was asked, and when to try again."""
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


def request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


def json_response(
    status: int, content: dict[str, Any], headers: dict[str, str] | None = None
) -> JSONResponse:
    """A JSON answer carrying a fresh x-request-id, as every OpenAI answer does."""
    all_headers = {**(headers or {}), "x-request-id": request_id()}
    return JSONResponse(content, status_code=status, headers=all_headers)

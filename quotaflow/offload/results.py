"""A provider batch's result lines, read as what a direct call would have given.

OpenAI's output and error files hold batch output lines ({custom_id, response:
{status_code, request_id, body}, error}); Anthropic's results hold {custom_id, result:
{type: succeeded|errored|canceled|expired, message|error}}. Each becomes the answer a
call would have returned (a ProviderResponse with its usage, in the provider's shape:
reshaped later to the job's output format), a Failure, or a line the provider never
ran (cancelled or expired), and says whether another deployment may be worth a try.
"""

from dataclasses import dataclass
from typing import Any

from quotaflow.constants import OUTPUT_ANTHROPIC, OUTPUT_OPENAI
from quotaflow.offload.clients import RETRYABLE, line_of
from quotaflow.providers.anthropic_answers import message_usage
from quotaflow.providers.base import ProviderResponse, usage_of
from quotaflow.providers.outcomes import Failure, FailureCode

# Anthropic's error types -> the HTTP status a direct call would have had.
ANTHROPIC_STATUS = {"invalid_request_error": 400, "authentication_error": 401,
                    "permission_error": 403, "not_found_error": 404,
                    "request_too_large": 413, "rate_limit_error": 429, "api_error": 500,
                    "overloaded_error": 529}
UNRUN = {"batch_cancelled": "cancelled", "batch_expired": "expired", "canceled": "cancelled",
         "cancelled": "cancelled", "expired": "expired"}


@dataclass(frozen=True)
class LineResult:
    """One line's result: `kind` is succeeded, errored, cancelled or expired; `outcome`
    the answer or failure to store (None for a line never run); `retryable`: another
    deployment may well answer it (5xx, 429, a line never run)."""

    line_no: int
    kind: str
    outcome: ProviderResponse | Failure | None
    retryable: bool


def read_line(raw: dict[str, Any], provider: str) -> LineResult | None:
    """The result of one line of a provider's results, None if it names no line of ours."""
    line_no = line_of(raw.get("custom_id"))
    if line_no is None:
        return None
    if provider == "anthropic-batch":
        return _anthropic(line_no, raw.get("result") or {})
    return _openai(line_no, raw)


def _openai(line_no: int, raw: dict[str, Any]) -> LineResult:
    response, error = raw.get("response"), raw.get("error")
    if isinstance(response, dict) and isinstance(response.get("status_code"), int):
        status, body = response["status_code"], response.get("body")
        if status < 400 and isinstance(body, dict):
            prompt, completion, cached = usage_of(body)
            return LineResult(line_no, "succeeded", ProviderResponse(
                status, body, response.get("request_id"), prompt, completion,
                cached_tokens=cached, answer_format=OUTPUT_OPENAI), False)
        message = _message(body) or _message({"error": error}) or f"HTTP {status}"
        return LineResult(line_no, "errored", Failure(
            FailureCode.PROVIDER_ERROR, f"provider batch: HTTP {status}: {message}", status,
            body if isinstance(body, dict) else None, 1),
            status in RETRYABLE or status >= 500)
    code = str((error or {}).get("code") or "")
    if code in UNRUN:
        return LineResult(line_no, UNRUN[code], None, True)
    message = (error or {}).get("message") or "the provider batch gave no result"
    return LineResult(line_no, "errored", Failure(
        FailureCode.PROVIDER_ERROR, f"provider batch: {code or 'error'}: {message}"), True)


def _anthropic(line_no: int, result: dict[str, Any]) -> LineResult:
    kind = result.get("type")
    if kind == "succeeded" and isinstance(result.get("message"), dict):
        message = result["message"]
        prompt, completion, cached, written, hour = message_usage(message)
        return LineResult(line_no, "succeeded", ProviderResponse(
            200, message, message.get("id"), prompt, completion, cached_tokens=cached,
            cache_write_tokens=written, cache_write_1h_tokens=hour,
            answer_format=OUTPUT_ANTHROPIC), False)
    if kind in UNRUN:
        return LineResult(line_no, UNRUN[str(kind)], None, True)
    error = result.get("error") or {}
    nested = error.get("error")
    inner = nested if isinstance(nested, dict) else error
    status = ANTHROPIC_STATUS.get(str(inner.get("type")), 500)
    return LineResult(line_no, "errored", Failure(
        FailureCode.PROVIDER_ERROR,
        f"provider batch: HTTP {status}: {inner.get('message') or inner.get('type')}",
        status, error if isinstance(error, dict) else None, 1),
        status in RETRYABLE or status >= 500)


def _message(body: Any) -> str | None:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        message: str | None = body["error"].get("message")
        return message
    return None

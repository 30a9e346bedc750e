"""Any OpenAI-compatible HTTP API: OpenAI itself, vLLM, SGLang, Ollama, the mock server.

Errors from httpx are translated here, at the edge, into quotaflow's
retryable/permanent provider errors, so nothing above knows about httpx.
"""

import email.utils
import time
from typing import Any

import httpx

from quotaflow.config import Deployment
from quotaflow.errors import PermanentProviderError, RetryableProviderError
from quotaflow.providers.base import ProviderResponse, usage_of

# 408 timeout, 409 conflict, 429 rate limit: OpenAI's docs list these as safe to retry.
RETRYABLE_STATUS = frozenset({408, 409, 429})


def parse_retry_after(headers: httpx.Headers) -> float | None:
    """Seconds to wait from Retry-After (seconds or HTTP date) or retry-after-ms."""
    if (ms := headers.get("retry-after-ms")) is not None:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value) if value else None
        return max(0.0, parsed.timestamp() - time.time()) if parsed else None


class OpenAICompatProvider:
    """Sends batch lines to {base_url}/chat/completions etc. with the deployment's key."""

    def __init__(self, deployment: Deployment) -> None:
        headers = {"Content-Type": "application/json"}
        key = deployment.api_key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.AsyncClient(
            base_url=deployment.base_url.rstrip("/") + "/",
            headers=headers,
            timeout=httpx.Timeout(deployment.timeout_s, connect=min(10.0, deployment.timeout_s)),
            limits=httpx.Limits(max_connections=deployment.max_concurrency),
        )
        self._name = deployment.name

    async def send(self, url: str, body: dict[str, Any]) -> ProviderResponse:
        # Batch lines say /v1/chat/completions; base_url already ends in /v1.
        path = url.removeprefix("/v1/")
        try:
            response = await self._client.post(path, json=body)
        except httpx.TimeoutException as exc:
            raise RetryableProviderError(f"{self._name}: request timed out") from exc
        except httpx.TransportError as exc:
            raise RetryableProviderError(
                f"{self._name}: connection failed ({exc.__class__.__name__})") from exc
        return self._interpret(response)

    def _interpret(self, response: httpx.Response) -> ProviderResponse:
        try:
            payload = response.json()
        except ValueError:
            payload = None
        status = response.status_code
        if status >= 400:
            message = _error_message(payload) or response.reason_phrase
            error_cls = (RetryableProviderError
                         if status in RETRYABLE_STATUS or status >= 500 else PermanentProviderError)
            raise error_cls(
                f"{self._name}: HTTP {status}: {message}",
                status_code=status,
                retry_after=parse_retry_after(response.headers),
                body=payload if isinstance(payload, dict) else None,
            )
        if not isinstance(payload, dict):
            raise RetryableProviderError(
                f"{self._name}: malformed response (HTTP {status}, not a JSON object)")
        prompt_tokens, completion_tokens = usage_of(payload)
        return ProviderResponse(
            status_code=status,
            body=payload,
            request_id=response.headers.get("x-request-id"),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            remaining_requests=_header_number(response.headers, "x-ratelimit-remaining-requests"),
            remaining_tokens=_header_number(response.headers, "x-ratelimit-remaining-tokens"),
        )

    async def aclose(self) -> None:
        await self._client.aclose()


def _header_number(headers: httpx.Headers, name: str) -> float | None:
    try:
        return float(headers[name])
    except (KeyError, ValueError):
        return None


def _error_message(payload: Any) -> str | None:
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return None

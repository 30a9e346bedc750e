"""Any OpenAI-compatible HTTP API: OpenAI itself, vLLM, SGLang, Ollama, the mock server.

One provider, hence one pool of keep-alive connections, lives as long as its
worker process's event loop: a client per batch cost a TLS context and a TCP
handshake per batch. The client is quotaflow's own lean HTTP/1.1 one (http1.py, through
edge.py, which both HTTP providers share):
httpx's pool cost about ten times aiohttp's CPU per request, and aiohttp's about
2.5 times a bare protocol's, which on a batch processor is most of the machine's
budget. Bodies go out as orjson bytes and come back parsed once; the answer's
own bytes are what gets stored.

Errors of the connection are translated here, at the edge, into quotaflow's
retryable/permanent provider errors, so nothing above knows about the client.
"""

import email.utils
import time
from collections.abc import Mapping
from typing import Any

from quotaflow import jsoncodec
from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import PermanentProviderError, ProviderError, RetryableProviderError
from quotaflow.providers.base import ProviderResponse, usage_of
from quotaflow.providers.edge import ProviderEdge

# 408 timeout, 409 conflict, 429 rate limit: OpenAI's docs list these as safe to retry.
RETRYABLE_STATUS = frozenset({408, 409, 429})


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
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
    """Sends batch lines to {base_url}/chat/completions etc. with the deployment's key.

    Built once per worker process and event loop (quotaflow/execution/loops.py);
    the session opens on the first call, inside the loop that will use it.
    """

    def __init__(self, deployment: Deployment) -> None:
        assert deployment.base_url is not None
        self._edge = ProviderEdge(deployment, deployment.base_url.rstrip("/") + "/", {},
                                  lambda key: f"Authorization: Bearer {key}")
        self._name = deployment.name

    async def send(self, url: str, body: dict[str, Any]) -> ProviderResponse:
        # Batch lines say /v1/chat/completions; base_url already ends in /v1.
        response = await self._edge.post(url.removeprefix("/v1/"), jsoncodec.dumps(body))
        return self._interpret(response.status, response.headers, response.reason or None,
                               response.body)

    def _interpret(self, status: int, headers: Mapping[str, str], reason: str | None,
                   raw: bytes) -> ProviderResponse:
        try:
            payload = jsoncodec.loads(raw)
        except ValueError:
            payload = None
        if status >= 400:
            raise self._error(status, headers, payload,
                              _error_message(payload) or reason or f"HTTP {status}")
        if not isinstance(payload, dict):
            raise RetryableProviderError(
                f"{self._name}: malformed response (HTTP {status}, not a JSON object)",
                request_id=request_id_of(headers))
        prompt_tokens, completion_tokens, cached_tokens = usage_of(payload)
        return ProviderResponse(
            status_code=status,
            body=payload,
            request_id=request_id_of(headers),
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=cached_tokens,
            remaining_requests=_header_number(headers, "x-ratelimit-remaining-requests"),
            remaining_tokens=_header_number(headers, "x-ratelimit-remaining-tokens"),
            raw=raw,
        )

    def _error(self, status: int, headers: Mapping[str, str], payload: Any, message: str,
               retry_after: float | None = None) -> ProviderError:
        """The failed call as quotaflow's error: 408, 409, 429 and 5xx worth another try."""
        error_cls = (RetryableProviderError
                     if status in RETRYABLE_STATUS or status >= 500 else PermanentProviderError)
        return error_cls(
            f"{self._name}: HTTP {status}: {message}",
            status_code=status,
            retry_after=parse_retry_after(headers) if retry_after is None else retry_after,
            body=payload if isinstance(payload, dict) else None,
            remaining=(_header_number(headers, "x-ratelimit-remaining-requests"),
                       _header_number(headers, "x-ratelimit-remaining-tokens")),
            request_id=request_id_of(headers),
        )

    async def aclose(self) -> None:
        await self._edge.aclose()


def request_id_of(headers: Mapping[str, str]) -> str | None:
    """The provider's id of the call: x-request-id, or apim-request-id where an Azure API
    Management gateway (Azure OpenAI's own, or a company's) answered without one."""
    return headers.get("x-request-id") or headers.get("apim-request-id")


def _header_number(headers: Mapping[str, str], name: str) -> float | None:
    """The header's number; None where it is absent (most providers, on every answer:
    a KeyError raised and caught cost three times the lookup) or not a number."""
    value = headers.get(name)
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _error_message(payload: Any) -> str | None:
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return None

"""Anthropic's Messages API: POST {base_url}/v1/messages with x-api-key and anthropic-version.

Sent through the edge openai_compat.py uses too (edge.py: one pooled HTTP/1.1 client per
worker loop, the key read at each call), bodies out as orjson bytes. The request body is
built by the preparer (anthropic_answers.py); the answer is handed up as Anthropic sent
it (`answer_format` "anthropic"), and made an OpenAI chat.completion only where the
job's output is OpenAI's. Its usage is read as OpenAI counts it (prompt tokens include
cached ones), its anthropic-ratelimit-* headers as the limiter's feedback: requests, and
with itpm/otpm the input and output tokens left; a deployment with one tpm reads only
the combined -tokens-remaining (an output figure would starve its combined bucket). A
429 without retry-after waits until the -reset of the limit it ran out of.

Errors come in Anthropic's shape {"type": "error", "error": {"type", "message"}}:
429 rate_limit_error, 529 overloaded_error, 5xx, 408 and 409 are worth another try
(as the official SDK retries them), other 4xx are permanent.

A line's `params.betas` (the Anthropic SDK's beta requests carry them so) goes out as the
`anthropic-beta` header, comma-separated, and is left out of the body.
"""

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from quotaflow import jsoncodec
from quotaflow.constants import ENDPOINT_MESSAGES, OUTPUT_ANTHROPIC
from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import PermanentProviderError, RetryableProviderError
from quotaflow.providers.anthropic_answers import message_usage
from quotaflow.providers.base import ProviderResponse
from quotaflow.providers.edge import ProviderEdge
from quotaflow.providers.openai_compat import RETRYABLE_STATUS, parse_retry_after

HEADER = "anthropic-ratelimit-"


class AnthropicProvider:
    """Sends prepared Messages API bodies to one anthropic deployment."""

    def __init__(self, deployment: Deployment) -> None:
        assert deployment.base_url is not None
        base = deployment.base_url.rstrip("/").removesuffix("/v1")
        self._edge = ProviderEdge(deployment, base + "/",
                                  {"anthropic-version": deployment.anthropic_version},
                                  lambda key: f"x-api-key: {key}")
        self._path = ENDPOINT_MESSAGES.removeprefix("/")
        self._name = deployment.name
        self._split = deployment.split_tokens

    async def send(self, url: str, body: dict[str, Any]) -> ProviderResponse:
        head = b""
        if "betas" in body:  # a line's params.betas: Anthropic's header, not a body field
            body = dict(body)
            head = beta_header(body.pop("betas"))
        response = await self._edge.post(self._path, jsoncodec.dumps(body), head)
        return self._interpret(response.status, response.headers, response.reason or None,
                               response.body)

    def _interpret(self, status: int, headers: Mapping[str, str], reason: str | None,
                   raw: bytes) -> ProviderResponse:
        try:
            payload = jsoncodec.loads(raw)
        except ValueError:
            payload = None
        requests, inputs, outputs = remaining(headers, self._split)
        if status >= 400:
            error = payload.get("error") if isinstance(payload, dict) else None
            message = (error.get("message") if isinstance(error, dict) else None) or reason \
                or f"HTTP {status}"
            kind = error.get("type") if isinstance(error, dict) else None
            retryable = status in RETRYABLE_STATUS or status >= 500
            raise (RetryableProviderError if retryable else PermanentProviderError)(
                f"{self._name}: HTTP {status}{f' {kind}' if kind else ''}: {message}",
                status_code=status,
                retry_after=parse_retry_after(headers) if status != 429
                else parse_retry_after(headers) or reset_wait(headers),
                body=payload if isinstance(payload, dict) else None,
                remaining=(requests, outputs), remaining_input=inputs,
                request_id=headers.get("request-id"))
        if not isinstance(payload, dict) or payload.get("type") != "message":
            raise RetryableProviderError(
                f"{self._name}: malformed response (HTTP {status}, not a Message object)",
                request_id=headers.get("request-id"))
        prompt, completion, cached, written, hour = message_usage(payload)
        return ProviderResponse(
            status_code=status, body=payload, request_id=headers.get("request-id"),
            prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached,
            cache_write_tokens=written, cache_write_1h_tokens=hour,
            remaining_requests=requests, remaining_tokens=outputs, raw=raw,
            remaining_input_tokens=inputs, answer_format=OUTPUT_ANTHROPIC)

    async def aclose(self) -> None:
        await self._edge.aclose()


def beta_header(betas: list[str]) -> bytes:
    """The anthropic-beta header line of a request's betas (none: no line)."""
    return f"anthropic-beta: {','.join(betas)}\r\n".encode() if betas else b""


def remaining(headers: Mapping[str, str], split: bool
              ) -> tuple[float | None, float | None, float | None]:
    """(requests, input tokens, tokens) left, from anthropic-ratelimit-*-remaining: with
    split budgets the input and output figures, else no input figure and the combined
    -tokens-remaining (the most restrictive of the token limits, Anthropic says)."""
    requests = _number(headers, HEADER + "requests-remaining")
    if not split:
        return requests, None, _number(headers, HEADER + "tokens-remaining")
    return (requests, _number(headers, HEADER + "input-tokens-remaining"),
            _number(headers, HEADER + "output-tokens-remaining"))


def reset_wait(headers: Mapping[str, str]) -> float | None:
    """Seconds until the latest -reset (RFC 3339) of a limit with nothing remaining."""
    now = datetime.now().astimezone()
    waits = []
    for kind in ("requests", "input-tokens", "output-tokens", "tokens"):
        left, reset = _number(headers, f"{HEADER}{kind}-remaining"), headers.get(
            f"{HEADER}{kind}-reset")
        if left is not None and left < 1 and reset:
            try:
                waits.append((datetime.fromisoformat(reset) - now).total_seconds())
            except ValueError:
                continue
    return max(0.0, max(waits)) if waits else None


def _number(headers: Mapping[str, str], name: str) -> float | None:
    try:
        return float(headers[name])
    except (KeyError, ValueError):
        return None

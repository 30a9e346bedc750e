"""AWS Bedrock Runtime: POST {base_url}/model/{modelId}/converse, or /invoke with an
Anthropic Messages body (`bedrock_api = "invoke"`), each request signed with SigV4.

Sent through the edge the other HTTP providers use (edge.py: one pooled HTTP/1.1 client
per worker loop), each request's Authorization and X-Amz-Date made by botocore's signer
over its path and body (bedrock_signing.py); a deployment with `api_key_env` sends a
Bedrock API key as a Bearer token instead. The base URL is the region's
bedrock-runtime endpoint unless `base_url` names another (a VPC endpoint, a proxy, a
test's mock). The model id goes in the path, percent-encoded as the AWS SDKs do (a
`:` of a version, the `/` of an ARN).

Bedrock sends no rate-limit headers. Its errors are `{"message": ...}` with the
exception's name in x-amzn-ErrorType: ThrottlingException (429), ModelNotReadyException
(429) and ServiceUnavailableException (503, "too many connections" when on-demand
capacity runs short) are read as rate limiting, a 429 to the limiter, and retried;
ModelTimeoutException (408) and 5xx are retried and count towards the circuit; other
4xx (ValidationException, AccessDeniedException, ...) are permanent.
"""

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from quotaflow import jsoncodec
from quotaflow.constants import OUTPUT_ANTHROPIC
from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import PermanentProviderError, RetryableProviderError
from quotaflow.providers.anthropic_answers import message_usage
from quotaflow.providers.base import ProviderResponse
from quotaflow.providers.bedrock_answers import message_from_converse
from quotaflow.providers.bedrock_signing import Signer, endpoint_url, region_of
from quotaflow.providers.edge import ProviderEdge
from quotaflow.providers.openai_compat import parse_retry_after

# The exceptions that mean "slow down": the limiter hears them as a 429.
THROTTLED = frozenset({"ThrottlingException", "ModelNotReadyException",
                       "ServiceUnavailableException"})
RETRYABLE_STATUS = frozenset({408, 429})


class BedrockProvider:
    """Sends prepared Converse (or InvokeModel) bodies to one bedrock deployment."""

    def __init__(self, deployment: Deployment) -> None:
        self._signer: Signer | None = None
        if deployment.api_key_env is not None:  # a Bedrock API key, as a Bearer token
            base = endpoint_url(deployment, None if deployment.base_url
                                else region_of(deployment))
        else:
            self._signer = Signer(deployment)
            base = self._signer.base_url
        self._edge = ProviderEdge(deployment, base, {},
                                  lambda key: f"Authorization: Bearer {key}")
        self._converse = deployment.bedrock_api == "converse"
        operation = "converse" if self._converse else "invoke"
        self._path = f"model/{quote(deployment.model, safe='')}/{operation}"
        self._name, self._model = deployment.name, deployment.model

    async def send(self, url: str, body: dict[str, Any]) -> ProviderResponse:
        raw = jsoncodec.dumps(body)
        signed = self._signer.head(self._path, raw) if self._signer is not None else b""
        response = await self._edge.post(self._path, raw, signed)
        return self._interpret(response.status, response.headers, response.reason or None,
                               response.body)

    def _interpret(self, status: int, headers: Mapping[str, str], reason: str | None,
                   raw: bytes) -> ProviderResponse:
        try:
            payload = jsoncodec.loads(raw)
        except ValueError:
            payload = None
        request_id = headers.get("x-amzn-requestid")
        if status >= 400:
            raise self._error(status, headers, reason, payload)
        if not isinstance(payload, dict):
            raise RetryableProviderError(
                f"{self._name}: malformed response (HTTP {status}, not a JSON object)")
        if self._converse:
            if not isinstance(payload.get("output"), dict):
                raise RetryableProviderError(
                    f"{self._name}: malformed response (HTTP {status}, no Converse output)")
            message, raw_kept = message_from_converse(payload, self._model, request_id), None
        elif payload.get("type") != "message":
            raise RetryableProviderError(
                f"{self._name}: malformed response (HTTP {status}, not a Message object)")
        else:
            message, raw_kept = payload, raw
        prompt, completion, cached, written, hour = message_usage(message)
        return ProviderResponse(
            status_code=status, body=message, request_id=request_id, prompt_tokens=prompt,
            completion_tokens=completion, cached_tokens=cached, cache_write_tokens=written,
            cache_write_1h_tokens=hour, raw=raw_kept,
            answer_format=OUTPUT_ANTHROPIC)

    def _error(self, status: int, headers: Mapping[str, str], reason: str | None,
               payload: Any) -> RetryableProviderError | PermanentProviderError:
        kind = error_type(headers, payload)
        message = None
        if isinstance(payload, dict):
            message = payload.get("message") or payload.get("Message")
        text = f"{self._name}: HTTP {status}{f' {kind}' if kind else ''}: " \
               f"{message or reason or 'no message'}"
        throttled = kind in THROTTLED or status == 429
        retryable = throttled or status in RETRYABLE_STATUS or status >= 500
        return (RetryableProviderError if retryable else PermanentProviderError)(
            text, status_code=429 if throttled else status,
            retry_after=parse_retry_after(headers),
            body=payload if isinstance(payload, dict) else None)

    async def aclose(self) -> None:
        await self._edge.aclose()


def error_type(headers: Mapping[str, str], payload: Any) -> str | None:
    """The exception's name: x-amzn-ErrorType before its ':', else the body's __type
    after its '#'."""
    header = headers.get("x-amzn-errortype")
    if header:
        return header.split(":", 1)[0]
    if isinstance(payload, dict) and isinstance(payload.get("__type"), str):
        name: str = payload["__type"].rsplit("#", 1)[-1]
        return name
    return None

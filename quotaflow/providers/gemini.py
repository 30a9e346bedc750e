"""Google's generateContent: the Gemini API (`gemini`, an API key in x-goog-api-key) and
Vertex AI (`vertex`, an OAuth token from google-auth: google_auth.py).

Gemini API: POST {base_url}/models/{model}:generateContent, base_url defaulting to
https://generativelanguage.googleapis.com/v1beta. Vertex AI: POST
{base_url}/projects/{project}/locations/{location}/publishers/google/models/{model}
:generateContent, base_url defaulting to https://{location}-aiplatform.googleapis.com/v1
(https://aiplatform.googleapis.com/v1 for the `global` location). Both send the same
body (translate/to_gemini.py builds it) and answer in the same shape, made an OpenAI
chat.completion here (gemini_answers.py) and an Anthropic Message where the job asks.

Neither sends rate-limit headers, so quotaflow's own budget is all there is to keep
under the quota; a 429 RESOURCE_EXHAUSTED waits for its RetryInfo's retryDelay. Errors
come as {"error": {"code", "message", "status"}}: 429, 408, 409 (ABORTED) and 5xx are
worth another try, other 4xx are permanent.
"""

from collections.abc import Mapping
from typing import Any

from quotaflow import jsoncodec
from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import PermanentProviderError, RetryableProviderError
from quotaflow.providers.base import ProviderResponse
from quotaflow.providers.edge import ProviderEdge
from quotaflow.providers.gemini_answers import (
    completion_from_generate,
    error_parts,
    usage_counts,
)
from quotaflow.providers.openai_compat import RETRYABLE_STATUS, parse_retry_after

GEMINI_URL = "https://generativelanguage.googleapis.com/v1beta"
KEY_HEADER = "x-goog-api-key"


def google_base_url(deployment: Deployment) -> str:
    """The deployment's base URL, or its kind's public one."""
    if deployment.base_url:
        return deployment.base_url.rstrip("/")
    if deployment.provider == "gemini":
        return GEMINI_URL
    host = ("aiplatform.googleapis.com" if deployment.location == "global"
            else f"{deployment.location}-aiplatform.googleapis.com")
    return f"https://{host}/v1"


def model_path(deployment: Deployment) -> str:
    """The generateContent path under the base URL."""
    method = f"models/{deployment.model}:generateContent"
    if deployment.provider == "gemini":
        return method
    return (f"projects/{deployment.project}/locations/{deployment.location}/publishers/google/"
            + method)


class GeminiProvider:
    """Sends generateContent bodies to one gemini or vertex deployment."""

    def __init__(self, deployment: Deployment) -> None:
        base = google_base_url(deployment) + "/"
        self._edge: ProviderEdge
        if deployment.provider == "vertex":
            from quotaflow.providers.google_auth import TokenEdge, VertexTokens

            self._edge = TokenEdge(deployment, base, {}, VertexTokens(deployment))
        else:
            self._edge = ProviderEdge(deployment, base, {}, lambda key: f"{KEY_HEADER}: {key}")
        self._path = model_path(deployment)
        self._name, self._model = deployment.name, deployment.model

    async def send(self, url: str, body: dict[str, Any]) -> ProviderResponse:
        response = await self._edge.post(self._path, jsoncodec.dumps(body))
        return self._interpret(response.status, response.headers, response.reason or None,
                               response.body)

    def _interpret(self, status: int, headers: Mapping[str, str], reason: str | None,
                   raw: bytes) -> ProviderResponse:
        try:
            payload = jsoncodec.loads(raw)
        except ValueError:
            payload = None
        if status >= 400:
            kind, message, delay = error_parts(payload)
            retryable = status in RETRYABLE_STATUS or status >= 500
            raise (RetryableProviderError if retryable else PermanentProviderError)(
                f"{self._name}: HTTP {status}{f' {kind}' if kind else ''}: "
                f"{message or reason or f'HTTP {status}'}",
                status_code=status, retry_after=delay if delay is not None
                else parse_retry_after(headers),
                body=payload if isinstance(payload, dict) else None)
        if not isinstance(payload, dict) or not ("candidates" in payload
                                                 or "promptFeedback" in payload):
            raise RetryableProviderError(
                f"{self._name}: malformed response (HTTP {status}, not a GenerateContentResponse)")
        prompt, completion, cached, _ = usage_counts(payload)
        return ProviderResponse(
            status_code=status, body=completion_from_generate(payload, self._model),
            request_id=payload.get("responseId") or headers.get("x-request-id"),
            prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached)

    async def aclose(self) -> None:
        await self._edge.aclose()

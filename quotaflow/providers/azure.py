"""Azure OpenAI: the OpenAI-compatible provider with Azure's paths, auth and error bodies.

Two URL shapes, chosen by base_url: `https://NAME.openai.azure.com` (the deployment-name
path, `/openai/deployments/{model}/chat/completions?api-version=...`, where `model` is
the Azure deployment's name and `api_version` is required), or a base_url ending in
`/openai/v1` (Azure's v1 API, `/openai/v1/chat/completions`, the model in the body;
api-version only where one is set). The key goes in the `api-key` header; a deployment
without `api_key_env` sends an Entra ID bearer token instead (entra.py).

Azure sends OpenAI's x-ratelimit-remaining-requests/-tokens (read for reconciliation
as for OpenAI) and `retry-after-ms` with its 429s. Its error bodies are OpenAI's envelope
with Azure's codes ("429", "content_filter", "DeploymentNotFound"), or, from its API
Management gateway, `{"statusCode": 401, "message": ...}`: both are read, the code is put
in the message, and a 429 without a retry-after header waits what its message says
("Please retry after 6 seconds").
"""

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from quotaflow import jsoncodec
from quotaflow.constants import ENDPOINT_CHAT, ENDPOINT_COMPLETIONS, ENDPOINT_EMBEDDINGS
from quotaflow.deployments.deployment import Deployment
from quotaflow.deployments.extras import query_string
from quotaflow.errors import ProviderError
from quotaflow.providers.base import ProviderResponse
from quotaflow.providers.edge import ProviderEdge
from quotaflow.providers.entra import EntraToken, default_credential
from quotaflow.providers.openai_compat import OpenAICompatProvider, parse_retry_after

# What an azure deployment serves (providers/capabilities.py): the endpoints both URL
# shapes have for a deployment's model.
AZURE_ENDPOINTS = frozenset({ENDPOINT_CHAT, ENDPOINT_COMPLETIONS, ENDPOINT_EMBEDDINGS})
_RETRY_IN_MESSAGE = re.compile(r"retry after (\d+(?:\.\d+)?) seconds?", re.IGNORECASE)


def azure_base(deployment: Deployment) -> str:
    """The URL every call's path is added to, ending in '/'."""
    assert deployment.base_url is not None
    base = deployment.base_url.rstrip("/")
    if deployment.azure_v1:
        return base + "/"
    base = base.removesuffix("/openai")
    return f"{base}/openai/deployments/{quote(deployment.model, safe='')}/"


def azure_path(deployment: Deployment, url: str) -> str:
    """A batch line's url (`/v1/chat/completions`) as the path after azure_base, with the
    api-version where there is one."""
    path = url.removeprefix("/v1/")
    if deployment.api_version:
        path += "?" + query_string({"api-version": deployment.api_version})
    return path


def azure_error(payload: Any) -> tuple[str | None, str | None]:
    """(code, message) of an Azure error body: OpenAI's envelope (`code` a string, or the
    status as one) or API Management's `{"statusCode", "message"}`."""
    if not isinstance(payload, dict):
        return None, None
    error = payload.get("error")
    if isinstance(error, dict):
        code = error.get("code")
        inner = error.get("innererror")
        if isinstance(inner, dict) and inner.get("code"):
            code = f"{code}/{inner['code']}" if code else inner["code"]
        message = error.get("message")
        return (str(code) if code else None), (str(message) if message else None)
    if "statusCode" in payload and payload.get("message"):
        return None, str(payload["message"])
    return None, None


def message_wait(message: str | None) -> float | None:
    """Seconds from "Please retry after N seconds" in an Azure 429's message."""
    found = _RETRY_IN_MESSAGE.search(message or "")
    return float(found.group(1)) if found else None


class AzureProvider(OpenAICompatProvider):
    """Sends batch lines to one Azure OpenAI deployment."""

    def __init__(self, deployment: Deployment) -> None:
        self._deployment = deployment
        self._edge = ProviderEdge(deployment, azure_base(deployment), {},
                                  lambda key: f"api-key: {key}")
        self._name = deployment.name
        self._paths = {url: azure_path(deployment, url) for url in AZURE_ENDPOINTS}
        self._token = (None if deployment.api_key_env
                       else EntraToken(deployment.name, default_credential()))

    async def send(self, url: str, body: dict[str, Any]) -> ProviderResponse:
        path = self._paths.get(url) or azure_path(self._deployment, url)
        head = await self._token.head() if self._token is not None else b""
        response = await self._edge.post(path, jsoncodec.dumps(body), head)
        return self._interpret(response.status, response.headers, response.reason or None,
                               response.body)

    def _error(self, status: int, headers: Mapping[str, str], payload: Any, message: str,
               retry_after: float | None = None) -> ProviderError:
        code, azure_message = azure_error(payload)
        text = azure_message or message
        if code and code != str(status):
            text = f"{code}: {text}"
        if retry_after is None and parse_retry_after(headers) is None and status == 429:
            retry_after = message_wait(azure_message)
        return super()._error(status, headers, payload, text, retry_after)

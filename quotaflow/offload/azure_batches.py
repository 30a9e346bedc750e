"""Azure OpenAI's Batch API for `azure-batch` deployments: OpenAI's files and batches,
under the resource's `/openai/` with `api-version`, through the openai SDK's AzureOpenAI.

A global-batch deployment's jobs differ from OpenAI's in little: the calls carry
`api-key` (or an Entra ID token from azure-identity's chain, as an `azure` deployment's
do), each line's `url` is `/chat/completions` without OpenAI's `/v1`, its `body.model`
the batch deployment's name, and the batch's `endpoint` the same path. Find, poll,
cancel and the output files are OpenAI's (clients.OpenAIBatches), as are the result
lines, read by quotaflow/offload/results.py.
"""

from typing import Any

from quotaflow.deployments.deployment import Deployment
from quotaflow.offload.clients import OpenAIBatches, custom_id, extras
from quotaflow.providers.entra import SCOPE, default_credential
from quotaflow.providers.translate.body import request_body


def azure_url(url: str) -> str:
    """A batch line's url as Azure's batch files name it: `/chat/completions`."""
    return "/" + url.removeprefix("/v1/").lstrip("/")


class AzureBatches(OpenAIBatches):
    """The files and batches of one Azure OpenAI resource, for one batch deployment."""

    def __init__(self, deployment: Deployment) -> None:
        import openai

        assert deployment.base_url is not None and deployment.api_version is not None
        self.deployment = deployment
        headers, query = extras(deployment)
        key = deployment.api_key()
        token: Any = None
        if key is None:
            credential = default_credential()

            def token() -> str:
                return str(credential.get_token(SCOPE).token)

        self.client = openai.AzureOpenAI(
            azure_endpoint=deployment.base_url.rstrip("/").removesuffix("/openai"),
            api_version=deployment.api_version, api_key=key, azure_ad_token_provider=token,
            timeout=deployment.timeout_s, max_retries=2, default_headers=headers,
            default_query=query)

    def request_line(self, line_no: int, url: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"custom_id": custom_id(line_no), "method": "POST", "url": azure_url(url),
                "body": request_body(body, self.deployment)}

    def submit(self, batch_id: str, url: str, lines: bytes) -> tuple[str, str | None]:
        return super().submit(batch_id, azure_url(url), lines)

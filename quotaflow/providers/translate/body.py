"""Which body a deployment gets for a stored request: as written to its own family,
translated to the other (both realtime calls, execution/prepare.py, and provider
batch lines, pbatch/clients.py, ask here)."""

from typing import Any

from quotaflow.constants import ANTHROPIC_PARAMS
from quotaflow.deployments.deployment import Deployment
from quotaflow.providers.translate.to_anthropic import messages_request
from quotaflow.providers.translate.to_bedrock import bedrock_request
from quotaflow.providers.translate.to_gemini import generate_request
from quotaflow.providers.translate.to_openai import chat_request

# Provider kinds that speak Anthropic's Messages API; every other kind speaks OpenAI's.
ANTHROPIC_KINDS = frozenset({"anthropic", "anthropic-batch"})
# Provider kinds that speak Google's generateContent (either family translated).
GOOGLE_KINDS = frozenset({"gemini", "vertex"})


def request_body(body: dict[str, Any], deployment: Deployment) -> dict[str, Any]:
    """The body as `deployment` receives it; Untranslatable names a field it cannot take.
    A same-family line costs one dict copy, as it always did."""
    if deployment.provider == "bedrock":  # Converse or InvokeModel
        return bedrock_request(body, deployment)
    if deployment.provider in ANTHROPIC_KINDS:
        return messages_request(body, deployment.model, deployment.default_max_tokens)
    if deployment.provider in GOOGLE_KINDS:
        return generate_request(body, deployment.default_max_tokens)
    params = body.get(ANTHROPIC_PARAMS)
    if params is not None:  # an Anthropic line, to an OpenAI-compatible deployment
        return chat_request(params, sent_model(params.get("model"), deployment))
    return {**body, "model": sent_model(body.get("model"), deployment)}


def sent_model(model: Any, deployment: Deployment) -> Any:
    """The model a deployment is sent: its own, but for a local one with LoRA adapters,
    where the line's model picks the adapter (or fails the line, if it names none:
    quotaflow/providers/local/adapters.py)."""
    if deployment.provider == "local" and deployment.adapters and model is not None:
        return model
    return deployment.model

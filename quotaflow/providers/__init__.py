"""Providers: where a deployment's requests go."""

from quotaflow.deployments.deployment import Deployment
from quotaflow.providers.base import Provider, ProviderResponse
from quotaflow.providers.mock import MockProvider

__all__ = ["Provider", "ProviderResponse", "make_provider"]


def make_provider(deployment: Deployment) -> Provider:
    if deployment.provider == "mock":
        return MockProvider()
    if deployment.provider == "local":
        # Imported here: the local provider's package is where torch may come in.
        from quotaflow.providers.local import LocalProvider

        return LocalProvider(deployment)
    if deployment.provider == "anthropic":
        from quotaflow.providers.anthropic import AnthropicProvider

        return AnthropicProvider(deployment)
    if deployment.provider in ("gemini", "vertex"):
        from quotaflow.providers.gemini import GeminiProvider

        return GeminiProvider(deployment)
    if deployment.provider == "bedrock":
        from quotaflow.providers.bedrock import BedrockProvider

        return BedrockProvider(deployment)
    if deployment.provider == "azure":
        from quotaflow.providers.azure import AzureProvider

        return AzureProvider(deployment)
    # Imported here: the HTTP client is the workers' business, not the API's or the CLI's.
    from quotaflow.providers.openai_compat import OpenAICompatProvider

    return OpenAICompatProvider(deployment)

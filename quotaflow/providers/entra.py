"""An Entra ID (Azure AD) bearer token for Azure OpenAI, from azure-identity's credential chain.

An `azure` deployment without `api_key_env` authenticates as the worker's identity:
DefaultAzureCredential tries the environment's service principal (AZURE_CLIENT_ID,
AZURE_TENANT_ID, AZURE_CLIENT_SECRET or a certificate), workload identity, the host's
managed identity, then developer logins (Azure CLI, azd, PowerShell), and asks for the
Cognitive Services scope. The token is fetched on the first call and again five minutes
before it expires, in a thread (the credential's HTTP calls are blocking, and the worker's
loop must not wait on them), one fetch at a time however many calls are waiting; every
other call reuses the encoded header. The token is never logged, and an error names the
credential's complaint, not the token.

azure-identity is the optional `azure` extra (`pip install quotaflow[azure]`): only a
deployment that needs a token imports it, and one that cannot fails its lines with a
configuration error naming the extra.
"""

import asyncio
import time
from typing import Any, Protocol

from quotaflow.errors import (
    ConfigError,
    PermanentProviderError,
    ProviderError,
    RetryableProviderError,
)

SCOPE = "https://cognitiveservices.azure.com/.default"
# Fetch a new token this long before the old one expires (azure-identity's own margin).
REFRESH_BEFORE_S = 300.0


class TokenCredential(Protocol):
    """azure-identity's credential interface, as much of it as is used here."""

    def get_token(self, *scopes: str) -> Any: ...


def default_credential() -> TokenCredential:
    """azure-identity's DefaultAzureCredential; ConfigError where it is not installed."""
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError as exc:
        raise ConfigError("an azure deployment without api_key_env authenticates with Entra "
                          "ID, which needs azure-identity: pip install 'quotaflow[azure]'"
                          ) from exc
    return DefaultAzureCredential()


class EntraToken:
    """The `Authorization: Bearer` header line of one deployment, kept fresh."""

    def __init__(self, deployment: str, credential: TokenCredential) -> None:
        self._name = deployment
        self._credential = credential
        self._head = b""
        self._expires_on = 0.0
        self._lock: asyncio.Lock | None = None

    async def head(self) -> bytes:
        """The header line (ending in CRLF), fetching a token first where it is due."""
        if time.time() < self._expires_on - REFRESH_BEFORE_S:
            return self._head
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:  # the first waiter fetches; the rest find it fresh
            if time.time() >= self._expires_on - REFRESH_BEFORE_S:
                await self._refresh()
        return self._head

    async def _refresh(self) -> None:
        try:
            token = await asyncio.to_thread(self._credential.get_token, SCOPE)
        except Exception as exc:  # azure-identity's errors and its transports' alike
            if time.time() < self._expires_on:
                return  # the old token still holds: try again on the next call
            raise _token_error(self._name, exc) from exc
        self._head = f"Authorization: Bearer {token.token}\r\n".encode()
        self._expires_on = float(token.expires_on)


def _token_error(deployment: str, exc: Exception) -> ProviderError:
    """No credential in the chain is configured: permanent (the operator must give one);
    any other failure (the token endpoint down, a timeout): worth another try."""
    kind = exc.__class__.__name__
    if kind == "CredentialUnavailableError":
        return PermanentProviderError(
            f"{deployment}: no Entra ID credential is available to this worker (set "
            "api_key_env, or give the worker an identity: AZURE_CLIENT_ID/AZURE_TENANT_ID/"
            f"AZURE_CLIENT_SECRET, a managed identity or `az login`): {_first_line(exc)}")
    return RetryableProviderError(f"{deployment}: Entra ID token: {kind}: {_first_line(exc)}")


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:300]

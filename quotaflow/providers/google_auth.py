"""Vertex AI's OAuth: an access token from google-auth, sent as `Authorization: Bearer`.

The credentials are a service account's key file where the deployment names one
(`credentials_file`), else google-auth's application default credentials (the
GOOGLE_APPLICATION_CREDENTIALS file, gcloud's user credentials, or the metadata server
of the machine the worker runs on), loaded when the provider is made, so missing
credentials fail the preparer once rather than every call. A token is refreshed before
it expires (google-auth's `valid` allows for its refresh margin), one refresh at a time
per worker loop; the refresh is blocking HTTP (google-auth's requests transport), so it
runs in a thread while the loop's other calls go on with the token they have.
"""

import asyncio
from typing import Any

from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import ConfigError, PermanentProviderError, RetryableProviderError
from quotaflow.providers.edge import ProviderEdge
from quotaflow.providers.http1 import Http1Response

SCOPE = "https://www.googleapis.com/auth/cloud-platform"


def load_credentials(deployment: Deployment) -> Any:
    """The deployment's google-auth credentials, scoped for Vertex AI."""
    try:
        import google.auth
        from google.auth.exceptions import DefaultCredentialsError
        from google.oauth2 import service_account
    except ImportError as exc:  # an optional dependency: pip install 'quotaflow[google]'
        raise ConfigError(f"deployment {deployment.name!r} (provider vertex) needs google-auth:"
                          " pip install 'quotaflow[google]'") from exc
    try:
        if deployment.credentials_file:
            return service_account.Credentials.from_service_account_file(
                deployment.credentials_file, scopes=[SCOPE])
        credentials, _ = google.auth.default(scopes=[SCOPE])
        return credentials
    except (DefaultCredentialsError, OSError, ValueError) as exc:
        raise ConfigError(f"deployment {deployment.name!r}: no Google credentials: {exc}") \
            from exc


class VertexTokens:
    """The deployment's current access token, refreshed when it is about to expire."""

    def __init__(self, deployment: Deployment) -> None:
        self._credentials = load_credentials(deployment)
        self._name = deployment.name
        self._lock: asyncio.Lock | None = None
        self._transport: Any = None

    @property
    def current(self) -> str | None:
        token: str | None = self._credentials.token
        return token

    async def fresh(self) -> str:
        """A token valid for the call about to be made."""
        if not self._credentials.valid:
            self._lock = self._lock or asyncio.Lock()
            async with self._lock:
                if not self._credentials.valid:
                    await asyncio.to_thread(self._refresh)
        return str(self._credentials.token)

    def _refresh(self) -> None:
        from google.auth.exceptions import GoogleAuthError, RefreshError, TransportError
        from google.auth.transport.requests import Request

        self._transport = self._transport or Request()
        try:
            self._credentials.refresh(self._transport)
        except TransportError as exc:
            raise RetryableProviderError(f"{self._name}: token refresh failed: {exc}") from exc
        except (RefreshError, GoogleAuthError) as exc:
            kind = (RetryableProviderError if getattr(exc, "retryable", False)
                    else PermanentProviderError)
            raise kind(f"{self._name}: token refresh refused: {exc}", status_code=401) from exc


class TokenEdge(ProviderEdge):
    """The edge, with a fresh OAuth token as the credential of each call."""

    def __init__(self, deployment: Deployment, base_url: str, headers: dict[str, str],
                 tokens: VertexTokens) -> None:
        self._tokens = tokens
        super().__init__(deployment, base_url, headers,
                         lambda token: f"Authorization: Bearer {token}")

    def _current_key(self) -> str | None:
        return self._tokens.current

    async def post(self, path: str, body: bytes, head: bytes = b"") -> Http1Response:
        await self._tokens.fresh()
        return await super().post(path, body, head)

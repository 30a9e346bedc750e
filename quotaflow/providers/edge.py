"""A provider's edge: the pooled HTTP/1.1 connection to one deployment, its key sent with
every call, and the connection's failures as quotaflow's retryable errors.

Both HTTP providers (openai_compat.py, anthropic.py) send through it, so they agree on
the things that are not theirs to decide: one pool per worker loop, opened on the first
call inside the loop that uses it, with no connection cap (the executor admits at most
max_concurrency calls, and an admitted call must not queue for a connection: budget
spent while waiting is refill the provider never sees); the API key read from the
environment when the provider is made (a missing key fails the preparer then, not every
call) and again at each call (a rotated key takes effect without a restart; the header
is encoded again only when the key changed); timeouts and broken connections retried.
"""

import asyncio
from collections.abc import Callable

from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import RetryableProviderError
from quotaflow.providers.http1 import Http1Error, Http1Pool, Http1Response


class ProviderEdge:
    """POSTs to one deployment's base URL; `auth` makes the key's header line."""

    def __init__(self, deployment: Deployment, base_url: str, headers: dict[str, str],
                 auth: Callable[[str], str]) -> None:
        self._deployment = deployment
        self._base = base_url
        self._headers = {"Content-Type": "application/json", **headers}
        self._auth = auth
        self._timeout_s = deployment.timeout_s
        self._name = deployment.name
        self._pool: Http1Pool | None = None
        self._key: str | None = None
        self._key_head = b""
        self._head_for(self._current_key())

    def _current_key(self) -> str | None:
        """The credential sent now: the deployment's key (a token source overrides it)."""
        return self._deployment.api_key()

    def _head_for(self, key: str | None) -> bytes:
        if key != self._key:
            self._key = key
            self._key_head = f"{self._auth(key)}\r\n".encode() if key else b""
        return self._key_head

    async def post(self, path: str, body: bytes, signed: bytes = b"") -> Http1Response:
        """POST `body`; `signed` holds header lines made for this one request (a
        signature over its path and body: bedrock_signing.py)."""
        pool = self._pool or self._open()
        head = self._head_for(self._current_key()) + signed
        try:
            return await pool.post(path, body, head)
        except TimeoutError as exc:
            raise RetryableProviderError(f"{self._name}: request timed out") from exc
        except (OSError, Http1Error) as exc:
            raise RetryableProviderError(
                f"{self._name}: connection failed ({exc.__class__.__name__})") from exc

    def _open(self) -> Http1Pool:
        self._pool = Http1Pool(self._base, self._headers, self._timeout_s,
                               min(10.0, self._timeout_s))
        return self._pool

    async def aclose(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            pool.close()
            # Let the transports' close callbacks run before the loop may end.
            await asyncio.sleep(0)

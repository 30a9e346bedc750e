"""A provider's edge: the pooled HTTP/1.1 connection to one deployment, its key sent with
every call, and the connection's failures as quotaflow's retryable errors.

Both HTTP providers (openai_compat.py, anthropic.py) send through it, so they agree on
the things that are not theirs to decide: one pool per worker loop, opened on the first
call inside the loop that uses it, with no connection cap (the executor admits at most
max_concurrency calls, and an admitted call must not queue for a connection: budget
spent while waiting is refill the provider never sees); the API key read from the
environment when the provider is made (a missing key fails the preparer then, not every
call) and again at each call (a rotated key takes effect without a restart; the header
is encoded again only when the key changed); the deployment's own `headers` and `query`
(quotaflow/deployments/extras.py) on every call, a provider's header of the same name
replaced by the deployment's, environment-named values read again at each call as the
key is; timeouts and broken connections retried.
"""

import asyncio
from collections.abc import Callable

from quotaflow.deployments.deployment import Deployment
from quotaflow.deployments.extras import header_lines, query_string, resolve, with_query
from quotaflow.errors import RetryableProviderError
from quotaflow.providers.http1 import Http1Error, Http1Pool, Http1Response


class ProviderEdge:
    """POSTs to one deployment's base URL; `auth` makes the key's header line."""

    def __init__(self, deployment: Deployment, base_url: str, headers: dict[str, str],
                 auth: Callable[[str], str]) -> None:
        self._deployment = deployment
        self._base = base_url
        own = {name.lower() for name in deployment.headers}
        self._headers = {"Content-Type": "application/json",
                         **{k: v for k, v in headers.items() if k.lower() not in own}}
        self._extras = bool(deployment.headers or deployment.query)
        self._extras_head = b""
        self._query = ""
        self._auth = auth
        self._timeout_s = deployment.timeout_s
        self._name = deployment.name
        self._pool: Http1Pool | None = None
        self._key: str | None = None
        self._key_head = b""
        self._head_for(self._current_key())
        self._resolve_extras()  # an unset variable fails the preparer now, not each call

    def _current_key(self) -> str | None:
        """The credential sent now: the deployment's key (a token source overrides it)."""
        return self._deployment.api_key()

    def _head_for(self, key: str | None) -> bytes:
        if key != self._key:
            self._key = key
            self._key_head = f"{self._auth(key)}\r\n".encode() if key else b""
        return self._key_head

    def _resolve_extras(self) -> None:
        deployment = self._deployment
        self._extras_head = header_lines(resolve(deployment.headers, self._name, "header"))
        self._query = query_string(resolve(deployment.query, self._name, "query parameter"))

    async def post(self, path: str, body: bytes, head: bytes = b"") -> Http1Response:
        """POST to the base URL + `path`, with `head`'s header lines (each ending in CRLF:
        made for this one request, as a signature over its path and body,
        bedrock_signing.py) after the key's and the deployment's."""
        pool = self._pool or self._open()
        head = self._head_for(self._current_key()) + head
        if self._extras:
            self._resolve_extras()
            head = self._extras_head + head
            path = with_query(path, self._query)
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

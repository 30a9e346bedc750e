"""Status reads answered from memory before the framework: the hot path of a crowd of
pollers.

With a job's object kept for `api_status_cache_s` (api/job_reads.py) and the key
remembered (quotaflow/tenants/key_cache.py), a poller's read cost no database work, yet
most of its time went on FastAPI's routing, dependency solving and the middlewares
around the route. A plain `GET /jobs/{id}` or `GET /v1/batches/{id}` (no query string)
whose key is remembered, may read, and whose tenant owns the job is answered here from
the recent object: the same bytes, `ETag` and 304 the route sends. Once the object is
stale the first read goes to the route, which reads the job again; the reads arriving
while that read is in flight wait for it here, as the route would have them wait, rather
than each going through the route to the same wait (under a crowd, that made most reads
the slow ones). Everything else (an unknown or expired key, a low scope, a missing object,
a long-poll, another tenant's job) goes on to the route, which answers it as before. The
middlewares outside this one (x-request-id, per-key limits, admission, security headers)
apply alike.
"""

import re
from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from api.etags import tagged_body
from api.job_reads import JobReads
from quotaflow.tenants.grants import Grant
from quotaflow.tenants.grants import Scope as KeyScope

# The read routes' paths and the view each keeps in JobReads (api/job_status.py, api/v1.py);
# the id as api/deps.py's ID_PATTERN accepts it.
_PATHS = re.compile(r"^/(?:(jobs)|v1/(batches))/([A-Za-z0-9_.:-]{1,128})$")
_VIEWS = {"jobs": "job", "batches": "batch"}
MAX_IF_NONE_MATCH = 4096  # api/etags.py's IfNoneMatch: a longer one is the route's 422

# The request's key (or None) -> its remembered grant, or None where the route must decide.
Remembered = Callable[[str | None], Grant | None]


def presented_key(headers: Headers) -> str | None:
    """The key as api/deps.py's `presented_key` reads it: `Authorization: Bearer` first,
    else `x-api-key`."""
    scheme, _, credentials = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and (credentials := credentials.strip()):
        return credentials
    return headers.get("x-api-key")


class StatusFastPath:
    """Answers the status reads it can from `reads` and `remembered`; the rest go on."""

    def __init__(self, app: ASGIApp, reads: Callable[[], JobReads],
                 remembered: Remembered) -> None:
        self.app = app
        self.reads = reads
        self.remembered = remembered
        self.answered = 0  # reads answered here, for the tests
        self.enabled = True  # off: every read goes to the route (bench/status_reads.py)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (self.enabled and scope["type"] == "http" and scope["method"] == "GET"
                and not scope["query_string"]
                and (found := _PATHS.match(scope["path"])) is not None):
            headers = Headers(scope=scope)
            if_none_match = headers.get("if-none-match")
            grant = self.remembered(presented_key(headers))
            if grant is not None and grant.scope >= KeyScope.READ:
                key = (_VIEWS[found.group(1) or found.group(2)], found.group(3))
                reads = self.reads()
                seen = reads.fresh(key) or await reads.being_read(key)
                if (seen is not None and seen.tenant == grant.tenant
                        and len(if_none_match or "") <= MAX_IF_NONE_MATCH):
                    self.answered += 1
                    response = tagged_body(seen.body, seen.etag, if_none_match)
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)

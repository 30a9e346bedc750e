"""Admission: an API process works on a bounded number of requests and says so at once
when it cannot take more.

A route's blocking work runs on a thread of AnyIO's pool and holds a database connection
while it does. With more requests than connections, threads waited up to the pool's 30 s
for a connection, and a request that had finished its route could not give its
connection back until a thread was free to run its session's exit: the whole API stalled
into 500s. Here at most `api_concurrency` requests are past the door at once; the thread
pool and the connection pool are sized to that (api/app.py), so an admitted request never
waits for either. The rest wait in line for at most `api_queue_timeout_s` and are then
answered 503 with Retry-After, in the error shape of their route.

Long-polls (`?wait=`), event streams, the probes and the status reads of a job are not
counted: they wait with asyncio, holding neither a thread nor a connection, or cost
nothing, or (status reads) are answered from memory with their database reads bounded
by api/job_reads.py.
"""

import asyncio
import re

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from api.anthropic_errors import in_route_shape
from api.errors import RETRY_AFTER_S, quotaflow_error_handler
from quotaflow.errors import ServiceUnavailable

_UNCOUNTED_PATHS = ("/healthz", "/metrics")
_STATUS_READ = re.compile(r"^/(jobs|v1/batches)/[^/]+$")


class Overloaded(ServiceUnavailable):
    """Every place of this API process is taken and the request waited its time in line."""


def counted(scope: Scope) -> bool:
    """Whether the request takes one of the process's places while it is served."""
    path: str = scope["path"]
    if path in _UNCOUNTED_PATHS or path.endswith("/events"):
        return False
    if scope["method"] == "GET" and _STATUS_READ.match(path):
        return False  # answered from memory or through api/job_reads.py's bounded reads
    return not any(part.startswith(b"wait=") for part in scope["query_string"].split(b"&"))


class AdmissionMiddleware:
    """At most `concurrency` counted requests at once; a later one waits its turn for up
    to `queue_timeout_s`, then gets 503 with Retry-After (Overloaded, answered by
    api/errors.py as every error is, in its route's shape)."""

    def __init__(self, app: ASGIApp, concurrency: int, queue_timeout_s: float) -> None:
        self.app = app
        self.queue_timeout_s = queue_timeout_s
        self.places = asyncio.Semaphore(concurrency)
        self.concurrency = concurrency
        self.refuse = in_route_shape(quotaflow_error_handler)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not counted(scope):
            await self.app(scope, receive, send)
            return
        try:
            await asyncio.wait_for(self.places.acquire(), self.queue_timeout_s)
        except TimeoutError:
            busy = Overloaded(f"the API is serving {self.concurrency} requests and more are "
                              f"waiting; ask again in {RETRY_AFTER_S} s (Retry-After)")
            await (await self.refuse(Request(scope), busy))(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.places.release()


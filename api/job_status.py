"""A job's status reads: `GET /jobs/{id}` (with its `ETag`, and `?wait=N`, the
long-poll) and `GET /jobs/{id}/events` (Server-Sent Events).

The waiting routes are async and hold no database connection nor thread while they
wait: they wait on the process's one reader of the job (api/job_watch.py). Only the
plain read, and the key's check in the `tenant` dependency, read the database at once.
"""

import contextlib
import functools
import logging
import math
from collections.abc import Callable
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import Response
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask

from api import deps, job_notices
from api.deps import IdPath, SessionsDep, TenantDep
from api.errors import responses
from api.etags import NOT_MODIFIED, IfNoneMatch, matches
from api.job_reads import Seen, tagged
from api.job_watch import JobWatchers, Waiter, read_job
from api.schemas.jobs import Job

MAX_WAIT_S = 30.0
log = logging.getLogger("quotaflow.api")
EVENT = "job"

router = APIRouter(tags=["jobs"])

WaitQuery = Annotated[float | None, Query(
    gt=0, le=MAX_WAIT_S,
    description="Long-poll: answer once the job's object differs from the `If-None-Match` "
                "tag (without one: from the job as the request found it), once the job is "
                f"final, or after this many seconds (at most {MAX_WAIT_S:g}) as it is then")]
LastEventId = Annotated[str | None, Header(
    alias="Last-Event-ID", max_length=4096,
    description="The last event's id (the job's ETag then): a reconnecting client is sent "
                "the job again only once it has changed")]
EVENTS_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "`text/event-stream`: an event `job` (id: the object's ETag, data: "
                         "the job object) at once and at each change, a comment every "
                         "QUOTAFLOW_EVENTS_KEEPALIVE_S; it ends after a final status",
          "content": {"text/event-stream": {"schema": {
              "type": "object", "required": ["event", "id", "data"], "properties": {
                  "event": {"const": EVENT}, "id": {"type": "string"},
                  "data": {"type": "string", "contentMediaType": "application/json",
                           "contentSchema": {"$ref": "#/components/schemas/Job"}}}}}}},
    204: {"description": "The job is final and `Last-Event-ID` names its last state: "
                         "nothing more will come (an EventSource stops reconnecting)"},
}


def watchers(request: Request) -> JobWatchers:
    """The app's one registry of watched jobs (one per process)."""
    state = request.app.state
    found: JobWatchers | None = getattr(state, "job_watchers", None)
    if found is None:
        settings = deps.get_settings()
        dsn = job_notices.listen_dsn(settings.database_url)
        notices = None if dsn is None else functools.partial(job_notices.listen, dsn)
        found = state.job_watchers = JobWatchers(deps.job_reads(),
                                                 settings.watch_interval_s, notices)
    return found


@router.get("/jobs/{job_id}", response_model=Job,
            responses={**NOT_MODIFIED, **responses(401, 404)})
async def get_job(job_id: IdPath, request: Request, sessions: SessionsDep, tenant: TenantDep,
                  if_none_match: IfNoneMatch = None, wait: WaitQuery = None) -> Response:
    """The job, with its `ETag` (304 for a matching `If-None-Match`); with `wait`, a
    long-poll that answers when the job changes."""
    if wait is None:  # read at most once per QUOTAFLOW_API_STATUS_CACHE_S, whoever asks
        read = functools.partial(read_job, job_id=job_id)
        return tagged(await deps.job_reads().read(("job", job_id), tenant, read),
                      if_none_match)
    async with watchers(request).watching(job_id, tenant) as waiter:
        arrival = await waiter.current()

        def wanted(seen: Seen) -> bool:
            if seen.final:
                return True
            if if_none_match is None:
                return seen.etag != arrival.etag
            return not matches(if_none_match, seen.etag)

        seen = await _unless_gone(request, waiter, wanted, wait)
    if seen is None:  # the client left: nobody reads this
        return Response(status_code=204)
    return tagged(seen, if_none_match)


async def _unless_gone(request: Request, waiter: Waiter, wanted: Callable[[Seen], bool],
                       wait: float) -> Seen | None:
    """The state the long-poll answers with, or None once the client disconnects (an
    async route is not cancelled when its client leaves: its waiter would stay)."""
    found: list[Seen] = []
    failed: list[Exception] = []
    async with anyio.create_task_group() as group:
        async def wait_for_job() -> None:
            try:
                found.append(await waiter.until(wanted, wait) or await waiter.current())
            except Exception as exc:  # the read failed: answered after the group
                failed.append(exc)
            group.cancel_scope.cancel()

        async def listen() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            group.cancel_scope.cancel()

        group.start_soon(wait_for_job)
        group.start_soon(listen)
    if failed:
        raise failed[0]
    return found[0] if found else None


@router.get("/jobs/{job_id}/events", response_class=EventSourceResponse,
            responses={**EVENTS_RESPONSES, **responses(401, 404)})
async def job_events(job_id: IdPath, request: Request, tenant: TenantDep,
                     last_event_id: LastEventId = None) -> Response:
    """The job's progress as Server-Sent Events, until it reaches a final status."""
    return await event_stream(request, job_id, tenant, last_event_id)


async def event_stream(request: Request, job_id: str, tenant: str,
                       last_event_id: str | None) -> Response:
    """The stream of a job checked to be the tenant's (404 before it starts)."""
    stream = JobStream(watchers(request), job_id, tenant, last_event_id)
    try:
        seen = await stream.open()
    except BaseException:
        await stream.close()
        raise
    if seen.final and matches(last_event_id, seen.etag):
        await stream.close()
        return Response(status_code=204)
    return EventSourceResponse(stream.events(), ping=deps.get_settings().events_keepalive_s,
                               background=BackgroundTask(stream.close),
                               headers={"Cache-Control": "no-store"})


class JobStream:
    """One client's stream: its waiter is taken when the route checks the job, and let
    go when the stream ends, the client leaves, or the response never starts."""

    def __init__(self, watchers: JobWatchers, job_id: str, tenant: str,
                 last_event_id: str | None) -> None:
        self._watchers, self._job_id, self._tenant = watchers, job_id, tenant
        self._last = last_event_id
        self._stack = contextlib.AsyncExitStack()
        self._waiter: Waiter | None = None

    async def open(self) -> Seen:
        self._waiter = await self._stack.enter_async_context(
            self._watchers.watching(self._job_id, self._tenant))
        return await self._waiter.current()

    async def close(self) -> None:
        await self._stack.aclose()

    async def events(self) -> Any:
        assert self._waiter is not None
        try:
            sent = self._last
            while True:

                def changed(state: Seen, last: str | None = sent) -> bool:
                    return not matches(last, state.etag)

                seen = await self._waiter.until(changed, math.inf)
                assert seen is not None
                yield ServerSentEvent(seen.body.decode(), event=EVENT, id=seen.etag)
                sent = seen.etag
                if seen.final:
                    return
        except Exception as exc:  # the job could not be read (an outage): the client
            # reconnects with Last-Event-ID, as after any broken stream
            log.warning("the event stream of job %s ended: %s", self._job_id,
                        exc.__class__.__name__)
        finally:
            await self.close()

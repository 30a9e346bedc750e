"""Recent job objects, shared by every reader of a job in this API process.

A thousand pollers of one job each asked the database for the same object several times
a second. Here a job's object is read at most once per `api_status_cache_s` per process
(and once at a time: readers arriving while it is read wait for that read), and every
poller in between is answered from memory, on the event loop, without a thread or a
connection. A job changed through this process (cancel, retry, delete) is read afresh at
once; a change made elsewhere (a worker storing answers, another API process) shows
within `api_status_cache_s`. These reads take no place in admission: an answer from
memory needs neither a thread nor a connection, and the reads of the database are
bounded here (LOADS_AT_ONCE), within the API's spare threads and connections.
"""

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from api.errors import RETRY_AFTER_S
from api.etags import render, tag_of, tagged_body
from quotaflow.errors import JobNotFound, ServiceUnavailable
from quotaflow.models import JobStatus

# Reads of the database at once, and how long one waits for its turn: status reads take no
# place in admission (api/admission.py), their misses are bounded here instead.
LOADS_AT_ONCE = 8
LOAD_QUEUE_S = 0.5
# Entries kept at most; past it, the oldest half goes (a busy API sees a few thousand jobs).
MAX_ENTRIES = 20_000

Load = Callable[[], tuple[str, dict[str, Any]]]


@dataclass(frozen=True)
class Seen:
    """The job as one read found it: its tenant, its object, the object's JSON and tag."""

    tenant: str
    job: dict[str, Any]
    body: bytes
    etag: str

    @property
    def final(self) -> bool:
        return self.job["status"] in JobStatus.FINAL


def tagged(seen: Seen, if_none_match: str | None) -> Response:
    """The object as read, with its `ETag`; 304 when the client already holds it."""
    return tagged_body(seen.body, seen.etag, if_none_match)


@dataclass(slots=True)
class Entry:
    until: float
    seen: Seen


Key = tuple[str, str]  # (view, job id)


class JobReads:
    """Job objects by (view, job id), each kept `max_age_s` seconds for every reader."""

    def __init__(self, max_age_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_s = max_age_s
        self.clock = clock
        self._entries: dict[Key, Entry] = {}
        self._reading: dict[Key, asyncio.Task[Entry]] = {}
        self._loads = asyncio.Semaphore(LOADS_AT_ONCE)

    async def read(self, key: tuple[str, str], tenant: str, load: Load) -> Seen:
        """The object of `key` = (view, job id) for `tenant`: from memory while fresh, else
        from `load` (run on a thread; returns the job's tenant and its object), shared with
        every reader waiting meanwhile. Another tenant's job is "not found"."""
        seen = await self.latest(key, load)
        if seen.tenant != tenant:
            raise JobNotFound(f"no job with id {key[1]!r}")
        return seen

    async def latest(self, key: tuple[str, str], load: Load) -> Seen:
        """The object of `key`, whoever's: from memory while fresh, else from `load`."""
        entry = self._entries.get(key)
        if entry is None or entry.until <= self.clock():
            entry = await self._load(key, load)
        return entry.seen

    def forget_all(self) -> None:
        """Drop every job's objects (a change whose jobs are not known by id)."""
        self._entries.clear()

    def forget(self, job_id: str) -> None:
        """Drop every view of a job this process has just changed."""
        for key in [key for key in self._entries if key[1] == job_id]:
            self._entries.pop(key, None)

    async def _load(self, key: Key, load: Load) -> Entry:
        # One read per key at a time, in a task of its own: a reader that goes away (its
        # client disconnected) does not take the others' answer with it.
        task = self._reading.get(key)
        if task is None:
            task = asyncio.ensure_future(self._fetch(key, load))
            self._reading[key] = task
            task.add_done_callback(lambda done: self._done(key, done))
        return await asyncio.shield(task)

    async def _fetch(self, key: Key, load: Load) -> Entry:
        try:
            await asyncio.wait_for(self._loads.acquire(), LOAD_QUEUE_S)
        except TimeoutError:
            raise ServiceUnavailable(
                "the API is reading as many jobs as it may at once; ask again in "
                f"{RETRY_AFTER_S} s (Retry-After)") from None
        try:
            tenant, job = await run_in_threadpool(load)
        finally:
            self._loads.release()
        body = render(job)
        entry = Entry(self.clock() + self.max_age_s, Seen(tenant, job, body, tag_of(body)))
        if self.max_age_s > 0:
            self._keep(key, entry)
        return entry

    def _done(self, key: Key, task: "asyncio.Task[Entry]") -> None:
        self._reading.pop(key, None)
        if not task.cancelled():
            task.exception()  # retrieved: a failed read nobody waited for logs nothing

    def _keep(self, key: Key, entry: Entry) -> None:
        if len(self._entries) >= MAX_ENTRIES:
            for old in list(self._entries)[:MAX_ENTRIES // 2]:
                self._entries.pop(old, None)
        self._entries[key] = entry

"""Recent job objects, shared by every reader of a job in this API process.

A thousand pollers of one job each asked the database for the same object several times
a second. Here a job's object is read at most once per `api_status_cache_s` per process
(and once at a time: readers arriving while it is read wait for that read), and every
poller in between is answered from memory, on the event loop, without a thread or a
connection. The reads of different jobs that wait at the same moment (the long-polls of
many small jobs, each read every watch interval) are made together, in one session on
one thread: one connection checkout and one transaction for all of them, not one each,
and the jobs with their figures read ahead in three statements (`prefetch`).
A job changed through this process (cancel, retry, delete) is read afresh at
once; a change made elsewhere (a worker storing answers, another API process) shows
within `api_status_cache_s`. These reads take no place in admission: an answer from
memory needs neither a thread nor a connection, and the reads of the database are
bounded here (LOADS_AT_ONCE), within the API's spare threads and connections.
"""

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from sqlalchemy.orm import Session

from api.errors import RETRY_AFTER_S
from api.etags import render, tag_of, tagged_body
from quotaflow.errors import JobNotFound, ServiceUnavailable
from quotaflow.models import JobStatus

# Reads of the database at once (threads, each with one session), and how long a job's read
# waits for its turn: status reads take no place in admission (api/admission.py), their
# misses are bounded here instead.
LOADS_AT_ONCE = 8
LOAD_QUEUE_S = 0.5
# Jobs read in one session at most: the waiting reads beyond it go in the next round.
JOBS_PER_SESSION = 64
# Entries kept at most; past it, the oldest half goes (a busy API sees a few thousand jobs).
MAX_ENTRIES = 20_000

# Reads one job in the session it is given: the job's tenant and its object.
Load = Callable[[Session], tuple[str, dict[str, Any]]]
Outcome = tuple[str, dict[str, Any]] | Exception
# Reads many jobs ahead into a session, by id, for the loads that follow in it.
Prefetch = Callable[[Session, list[str]], None]


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

    def __init__(self, max_age_s: float, sessions: Callable[[], Session],
                 clock: Callable[[], float] = time.monotonic,
                 prefetch: Prefetch | None = None) -> None:
        self.max_age_s = max_age_s
        self.clock = clock
        self._sessions = sessions
        self._prefetch = prefetch
        self._entries: dict[Key, Entry] = {}
        self._reading: dict[Key, asyncio.Task[Entry]] = {}
        # Reads waiting for a session: (when queued, job id, the read, its outcome's future).
        self._queued: list[tuple[float, str, Load,
                                 asyncio.Future[tuple[str, dict[str, Any]]]]] = []
        self._runners: set[asyncio.Task[None]] = set()
        self.sessions_used = 0  # sessions the reads were made in, for the tests

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

    def fresh(self, key: tuple[str, str]) -> Seen | None:
        """The object of `key` if one read less than `max_age_s` ago is kept, else None
        (nothing is read): api/status_fast_path.py answers from it."""
        entry = self._entries.get(key)
        if entry is None or entry.until <= self.clock():
            return None
        return entry.seen

    async def being_read(self, key: tuple[str, str]) -> Seen | None:
        """The object of `key` from the read of it now in flight (started by a route once
        the kept one went stale), awaited; None where no read is in flight or it failed
        (the route then reads, and answers any error as it does)."""
        task = self._reading.get(key)
        if task is None:
            return None
        try:
            return (await asyncio.shield(task)).seen
        except Exception:
            return None

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
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[str, dict[str, Any]]] = loop.create_future()
        if any(runner.get_loop() is not loop for runner in self._runners):  # a loop gone
            self._runners = {runner for runner in self._runners if runner.get_loop() is loop}
        # Only a read that finds every runner busy waits for its turn: it is timed from now.
        busy = len(self._runners) >= LOADS_AT_ONCE
        self._queued.append((self.clock() if busy else math.inf, key[1], load, future))
        if not busy:
            runner = asyncio.ensure_future(self._run_queued())
            self._runners.add(runner)
            runner.add_done_callback(self._runners.discard)
        tenant, job = await future
        body = render(job)
        entry = Entry(self.clock() + self.max_age_s, Seen(tenant, job, body, tag_of(body)))
        if self.max_age_s > 0:
            self._keep(key, entry)
        return entry

    async def _run_queued(self) -> None:
        """Read the queued jobs, JOBS_PER_SESSION at a time in one session, until none
        wait; a read that waited past LOAD_QUEUE_S for a free runner is answered 503."""
        while self._queued:
            taken = self._queued[:JOBS_PER_SESSION]
            del self._queued[:JOBS_PER_SESSION]
            late = self.clock() - LOAD_QUEUE_S
            due = []
            for queued_at, job_id, load, future in taken:
                if future.done():
                    continue
                if queued_at < late:
                    future.set_exception(ServiceUnavailable(
                        "the API is reading as many jobs as it may at once; ask again in "
                        f"{RETRY_AFTER_S} s (Retry-After)"))
                else:
                    due.append((job_id, load, future))
            if not due:
                continue
            try:
                outcomes = await run_in_threadpool(self._read_all, [load for _, load, _ in due],
                                                   [job_id for job_id, _, _ in due])
            except BaseException as exc:  # cancelled, or no session at all: none is read
                for *_, future in due:
                    if not future.done():
                        future.set_exception(exc if isinstance(exc, Exception)
                                             else ServiceUnavailable("the read was stopped"))
                raise
            for (*_, future), outcome in zip(due, outcomes, strict=True):
                if future.done():
                    continue
                if isinstance(outcome, Exception):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)

    def _read_all(self, loads: list[Load], job_ids: list[str]) -> list[Outcome]:
        """Each read's outcome, all in one session (on a thread), the jobs read ahead where
        there are several; a failed read's error is its outcome, and the session is rolled
        back for the next one."""
        self.sessions_used += 1
        outcomes: list[Outcome] = []
        with self._sessions() as session:
            if self._prefetch is not None and len(set(job_ids)) > 1:
                try:
                    self._prefetch(session, job_ids)
                except Exception:  # each load asks for its own, and says what went wrong
                    session.rollback()
            for load in loads:
                try:
                    outcomes.append(load(session))
                except Exception as exc:
                    outcomes.append(exc)
                    session.rollback()
        return outcomes

    def _done(self, key: Key, task: "asyncio.Task[Entry]") -> None:
        self._reading.pop(key, None)
        if not task.cancelled():
            task.exception()  # retrieved: a failed read nobody waited for logs nothing

    def _keep(self, key: Key, entry: Entry) -> None:
        if len(self._entries) >= MAX_ENTRIES:
            for old in list(self._entries)[:MAX_ENTRIES // 2]:
                self._entries.pop(old, None)
        self._entries[key] = entry

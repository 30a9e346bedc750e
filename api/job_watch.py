"""Watching a job without holding anything while waiting: the long-polls and event
streams of one API process share one reader per job.

A waiter holds no database connection and no thread: it waits on an asyncio event. One
task per watched job id reads the job (a short read in a worker thread) every
QUOTAFLOW_WATCH_INTERVAL_S and wakes every waiter of that job when its object changed,
so a thousand clients watching one job cost one read per interval. The task starts with
the first waiter and is cancelled when the last one leaves (a client that disconnects
leaves, as its request's task is cancelled). A notice that the job's status changed
(api/job_notices.py) has it read at once, not at its next interval.
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import anyio
from sqlalchemy.orm import Session

from api.job_reads import JobReads, Seen
from quotaflow.errors import JobNotFound, ServiceUnavailable
from quotaflow.jobs import service as jobs
from quotaflow.jobs import view as job_view

Reader = Callable[[Session, str], tuple[str, dict[str, Any]]]


@dataclass
class _Watch:
    """One job's reader and what its waiters wait on."""

    waiters: int = 0
    seen: Seen | None = None
    error: Exception | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    nudged: asyncio.Event = field(default_factory=asyncio.Event)  # read again now
    task: asyncio.Task[None] | None = None

    def publish(self, seen: Seen | None, error: Exception | None) -> None:
        self.seen, self.error = seen, error
        self.changed.set()
        self.changed = asyncio.Event()


def read_job(session: Session, job_id: str) -> tuple[str, dict[str, Any]]:
    """A job's tenant and object, read in the session given (api/job_reads.py's)."""
    job = jobs.get_job(session, job_id)
    return job.tenant, job_view.job_object(session, job)


class Waiter:
    """One client's view of a watched job; it only waits, the watch reads."""

    def __init__(self, watch: _Watch, job_id: str, tenant: str) -> None:
        self._watch, self._job_id, self._tenant = watch, job_id, tenant

    async def current(self) -> Seen:
        """The latest state (the first read's, once done); 404 for another tenant's job."""
        while self._watch.seen is None and self._watch.error is None:
            await self._watch.changed.wait()
        if self._watch.error is not None:  # one error for every waiter: a fresh traceback
            raise self._watch.error.with_traceback(None)
        assert self._watch.seen is not None
        if self._watch.seen.tenant != self._tenant:
            raise JobNotFound(f"no job with id {self._job_id!r}")
        return self._watch.seen

    async def until(self, wanted: Callable[[Seen], bool], timeout: float) -> Seen | None:
        """The first state `wanted` accepts, or None after `timeout` seconds."""
        with anyio.move_on_after(timeout):
            while True:
                changed = self._watch.changed
                seen = await self.current()
                if wanted(seen):
                    return seen
                await changed.wait()
        return None


class JobWatchers:
    """The process's watched jobs, by id."""

    def __init__(self, shared: JobReads, interval: float,
                 notices: Callable[[Callable[[str], None]], Coroutine[Any, Any, None]]
                 | None = None,
                 read: Reader = read_job) -> None:
        self._read = read
        self._shared = shared
        self._interval = interval
        self._watches: dict[str, _Watch] = {}
        self._notices = notices  # listens and calls back with job ids, until cancelled
        self._listening: asyncio.Task[None] | None = None
        self.reads = 0  # reads made, for /metrics and the tests

    def changed(self, job_id: str) -> None:
        """The job's status changed elsewhere: forget its recent read, and have its
        watch (if any) read it now."""
        self._shared.forget(job_id)
        if (watch := self._watches.get(job_id)) is not None:
            watch.nudged.set()

    @property
    def watched(self) -> dict[str, int]:
        """Waiters per watched job id."""
        return {job_id: watch.waiters for job_id, watch in self._watches.items()}

    @contextlib.asynccontextmanager
    async def watching(self, job_id: str, tenant: str) -> AsyncIterator[Waiter]:
        if self._notices is not None and self._listening is None:
            self._listening = asyncio.create_task(self._notices(self.changed),
                                                  name="job status notices")
        watch = self._watches.get(job_id)
        if watch is None:
            watch = self._watches[job_id] = _Watch()
            watch.task = asyncio.create_task(self._run(job_id, watch),
                                             name=f"watch {job_id}")
        watch.waiters += 1
        try:
            yield Waiter(watch, job_id, tenant)
        finally:
            watch.waiters -= 1
            if watch.waiters == 0:
                del self._watches[job_id]
                assert watch.task is not None
                watch.task.cancel()

    async def _run(self, job_id: str, watch: _Watch) -> None:
        def load(session: Session) -> tuple[str, dict[str, Any]]:
            return self._read(session, job_id)

        while True:
            watch.nudged.clear()  # before the read: a notice during it has the next one now
            try:  # through the process's recent reads: a plain GET of the job shares them
                seen = await self._shared.latest(("job", job_id), load)
            except ServiceUnavailable as exc:  # the process reads as many jobs as it may
                self.reads += 1
                if watch.seen is None or watch.error is not None:
                    watch.publish(None, exc)  # nothing to wait on yet: the waiters' 503
                # else the waiters keep the job as last read; the next round reads again
            except Exception as exc:  # the waiters answer it (404)
                self.reads += 1
                watch.publish(None, exc)
            else:
                self.reads += 1
                if watch.seen is None or watch.seen.etag != seen.etag or watch.error is not None:
                    watch.publish(seen, None)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(watch.nudged.wait(), self._interval)

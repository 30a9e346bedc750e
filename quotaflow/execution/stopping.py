"""A running batch notices within a second that its job was cancelled, expired, or
stopped because its tenant reached its monthly spend limit.

Claimed items used to keep going until their batch ended: a batch of 100
waiting for budget went on sending long after the operator pressed cancel.
The batch now reads its job's status (and completion window) every
STOP_CHECK_S while it admits, and ends the items it has not sent as cancelled
or expired; calls already sent finish and keep their results. A job another batch
stopped (its stop reason set) ends here too. The run's hooks may add checks of
their own to each read (`stop_check`: the spend hook adds up the tenant's month,
policies/spend_hook.py).
"""

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.jobs.service import expire_overdue
from quotaflow.models import ITEMS_ENDED_BY, ItemStatus, Job, JobStatus, utcnow
from quotaflow.providers.outcomes import UNSENT_CODES
from quotaflow.tenants import spend

# How often a running batch reads its job's status: one small query per batch per
# interval, and the most a cancel or an expiry waits to take effect.
STOP_CHECK_S = 0.5

CODES = UNSENT_CODES


class SharedReads:
    """The latest read of each job's status, shared by the batches one executor runs at
    once (one per thread of a worker): four batches of a job read it once an interval
    between them, not four times. On a worker waiting seconds on a model, each read
    (about a millisecond and a half of CPU on a small VM) was taken from the engine."""

    _KEEP = 1024  # jobs remembered before the stale are dropped

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reads: dict[str, tuple[float, str | None]] = {}

    def recent(self, job_id: str, now: float) -> tuple[float, str | None] | None:
        """(when, what) of a read of the job less than STOP_CHECK_S old, else None."""
        with self._lock:
            read = self._reads.get(job_id)
        return read if read is not None and now - read[0] < STOP_CHECK_S else None

    def keep(self, job_id: str, at: float, ended: str | None) -> None:
        with self._lock:
            if len(self._reads) >= self._KEEP:
                self._reads = {job: read for job, read in self._reads.items()
                               if at - read[0] < STOP_CHECK_S}
            self._reads[job_id] = (at, ended)


@dataclass
class JobWatch:
    """Whether the job still wants its requests sent; read at most every STOP_CHECK_S."""

    sessions: sessionmaker[Session]
    job_id: str
    # The run's hooks' own checks, asked after each read of a job still running
    # (hooks.py, `stop_check`): an item status to end the unsent items with, or None.
    checks: Sequence[Callable[[], str | None]] = ()
    # Where the batches of one executor share their reads; only without checks: a
    # batch whose hooks check more (the tenant's month) reads itself, at once.
    shared: SharedReads | None = None
    _checked: float = 0.0
    _ended: str | None = None
    _signal: "asyncio.Task[str] | None" = None

    def __post_init__(self) -> None:
        # With checks, the first read is at once: a batch claimed after its tenant's
        # limit was reached must not send a chunk first. Else, claimed just now: it runs.
        self._checked = float("-inf") if self.checks else time.monotonic()

    def ended(self) -> str | None:
        """ItemStatus.CANCELLED, EXPIRED or SPEND_LIMITED once the job is, else None."""
        now = time.monotonic()
        if self._ended is None and now - self._checked >= STOP_CHECK_S:
            shared = None if self.checks else self.shared
            if shared is not None and (read := shared.recent(self.job_id, now)) is not None:
                self._checked, self._ended = read  # the next look is due when it ages
                return self._ended
            self._checked = now
            try:
                self._ended = self._read()
            except OperationalError:  # the database is away: go on, look again later
                return None
            if shared is not None:
                shared.keep(self.job_id, now, self._ended)
        return self._ended

    def signal(self) -> "asyncio.Task[str]":
        """One task per batch that ends with ended()'s answer once the job ends: calls
        that can be aborted wait on it beside their answer. One reader for all of them,
        reading the moment each check is due, so a cancel is seen within STOP_CHECK_S
        (calls polling on their own each saw it up to a whole interval late)."""
        if self._signal is None:
            self._signal = asyncio.ensure_future(self._until_ended())
        return self._signal

    async def _until_ended(self) -> str:
        while (ended := self.ended()) is None:
            await asyncio.sleep(max(0.0, self._checked + STOP_CHECK_S - time.monotonic()))
        return ended

    async def close(self) -> None:
        """Stop the signal's reads: the batch has ended."""
        if self._signal is not None and not self._signal.done():
            self._signal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._signal

    def _read(self) -> str | None:
        jobs = Job.__table__.c
        with self.sessions() as session:
            status, expires_at, stop_reason = session.execute(
                select(jobs.status, jobs.expires_at, jobs.stop_reason)
                .where(jobs.id == self.job_id)).one()
        if status == JobStatus.IN_PROGRESS and expires_at is not None \
                and expires_at < utcnow():
            # The window ended: expire the job now, not at the reaper's next round.
            expire_overdue(self.sessions)
            return ItemStatus.EXPIRED
        if status == JobStatus.IN_PROGRESS:
            if stop_reason == spend.STOP_REASON:  # a batch saw its tenant's limit reached
                return ItemStatus.SPEND_LIMITED
            for check in self.checks:
                if (ended := check()) is not None:
                    return ended
        return ITEMS_ENDED_BY.get(status)

"""A running batch notices within a second that its job was cancelled or expired.

Claimed items used to keep going until their batch ended: a batch of 100
waiting for budget went on sending long after the operator pressed cancel.
The batch now reads its job's status (and completion window) every
STOP_CHECK_S while it admits, and ends the items it has not sent as cancelled
or expired; calls already sent finish and keep their results.
"""

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.jobs import expire_overdue
from quotaflow.models import ItemStatus, Job, JobStatus, utcnow
from quotaflow.outcomes import FailureCode

# How often a running batch reads its job's status: one small query per batch per
# interval, and the most a cancel or an expiry waits to take effect.
STOP_CHECK_S = 0.5

_ENDED = {JobStatus.CANCELLING: ItemStatus.CANCELLED, JobStatus.CANCELLED: ItemStatus.CANCELLED,
          JobStatus.EXPIRED: ItemStatus.EXPIRED}
CODES = {ItemStatus.CANCELLED: FailureCode.BATCH_CANCELLED,
         ItemStatus.EXPIRED: FailureCode.BATCH_EXPIRED}


@dataclass
class JobWatch:
    """Whether the job still wants its requests sent; read at most every STOP_CHECK_S."""

    sessions: sessionmaker[Session]
    job_id: str
    _checked: float = field(default_factory=time.monotonic)  # claimed just now: running
    _ended: str | None = None

    def ended(self) -> str | None:
        """ItemStatus.CANCELLED or EXPIRED once the job is, else None."""
        now = time.monotonic()
        if self._ended is None and now - self._checked >= STOP_CHECK_S:
            self._checked = now
            jobs = Job.__table__.c
            try:
                with self.sessions() as session:
                    status, expires_at = session.execute(
                        select(jobs.status, jobs.expires_at)
                        .where(jobs.id == self.job_id)).one()
                if (status == JobStatus.IN_PROGRESS and expires_at is not None
                        and _aware(expires_at) < utcnow()):
                    # The window ended: expire the job now, not at the reaper's next round.
                    expire_overdue(self.sessions)
                    status = JobStatus.EXPIRED
            except OperationalError:  # the database is away: go on, look again later
                return None
            self._ended = _ENDED.get(status)
        return self._ended


def _aware(moment: datetime) -> datetime:
    """SQLite hands datetimes back without their zone; they are UTC."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)

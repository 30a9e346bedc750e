"""A batch's first and last statements: the claim of its items, and the report that
closes the job when this was its last work and says when to look again at leases
another worker holds. Both are the store's (quotaflow/store/), for either database.
"""

from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from quotaflow import store
from quotaflow.dispatch.queues import BatchRef
from quotaflow.execution.batch import BatchReport
from quotaflow.results.leases import ClaimedItem, look_again_in


class Bookends:
    """Claims and reports the batches of one executor's database."""

    def __init__(self, sessions: sessionmaker[Session], lease: timedelta) -> None:
        self.sessions, self.lease = sessions, lease
        self.store = store.for_sessions(sessions)

    def claim(self, ref: BatchRef, owner: str) -> list[ClaimedItem]:
        """The batch's pending items (and those whose lease ran out), leased to `owner`."""
        return self.store.claim(self.sessions, ref, owner, self.lease)

    def report(self, ref: BatchRef, report: BatchReport) -> BatchReport:
        """Close the job if this was its last work; look again later at foreign leases."""
        with self.sessions.begin() as session:
            elsewhere = look_again_in(self.store.report(session, ref))
        if elsewhere is None:
            return report
        retry_in = elsewhere if report.retry_in is None else min(report.retry_in, elsewhere)
        return BatchReport(report.claimed, report.succeeded, report.failed, retry_in)

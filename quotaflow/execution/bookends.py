"""A batch's first and last statements: the claim of its items, and the report that
closes the job when this was its last work and says when to look again at leases
another worker holds. On PostgreSQL each is one prepared statement (results/batch_sql.py);
elsewhere (SQLite, the embedded runner) the portable statements of results/leases.py.
"""

from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from quotaflow.dispatch.queues import BatchRef
from quotaflow.execution.batch import BatchReport
from quotaflow.jobs.service import close_if_done
from quotaflow.results import batch_sql
from quotaflow.results.leases import ClaimedItem, claim, leased_elsewhere_for, look_again_in


class Bookends:
    """Claims and reports the batches of one executor's database."""

    def __init__(self, sessions: sessionmaker[Session], lease: timedelta) -> None:
        self.sessions, self.lease = sessions, lease
        bind = sessions.kw.get("bind")  # the prepared statements are PostgreSQL's
        self.postgres = bind is not None and bind.dialect.name == "postgresql"

    def claim(self, ref: BatchRef, owner: str) -> list[ClaimedItem]:
        """The batch's pending items (and those whose lease ran out), leased to `owner`."""
        return (batch_sql.claim if self.postgres else claim)(self.sessions, ref, owner,
                                                             self.lease)

    def report(self, ref: BatchRef, report: BatchReport) -> BatchReport:
        """Close the job if this was its last work; look again later at foreign leases."""
        with self.sessions.begin() as session:
            if self.postgres:  # one prepared statement (results/batch_sql.py)
                elsewhere = look_again_in(batch_sql.report(session, ref))
            else:
                close_if_done(session, ref.job_id)
                elsewhere = leased_elsewhere_for(session, ref)
        if elsewhere is None:
            return report
        retry_in = elsewhere if report.retry_in is None else min(report.retry_in, elsewhere)
        return BatchReport(report.claimed, report.succeeded, report.failed, retry_in)

"""Deleting a job that has ended: its requests and results gone, all or nothing.

The minimal form DELETE /v1/messages/batches/{id} needs (the lifecycle work keeps the
same signature). One transaction removes the job's results, items and provider-batch
bookkeeping and the job itself; the spend ledger keeps its rows, since the month's
spend (and its limit) does not shrink because a job's answers were thrown away. A job
still running (or an expired one whose last calls are still out) is refused: its
workers would write results for a job that is gone.
"""

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.errors import JobNotFound, JobStateError
from quotaflow.models import Item, ItemStatus, Job, JobStatus, Result
from quotaflow.pbatch.tables import ProviderBatch, ProviderBatchLine


def delete_job(sessions: sessionmaker[Session], job_id: str, tenant: str) -> None:
    """Remove the tenant's ended job and everything stored of its requests.

    JobNotFound for another tenant's job or none; JobStateError while it runs (cancel it
    first). The job's row is locked first, so a cancel or retry cannot slip in between.
    """
    with sessions.begin() as session:
        job = session.scalar(select(Job).where(Job.id == job_id).with_for_update())
        if job is None or job.tenant != tenant:
            raise JobNotFound(f"no job with id {job_id!r}")
        running = session.scalar(select(Item.line_no).where(
            Item.job_id == job_id, Item.status.in_(ItemStatus.OPEN)).limit(1))
        if job.status in JobStatus.ACTIVE or running is not None:
            raise JobStateError(f"job {job_id} is {job.status}; cancel it first and delete it "
                                "once it has ended")
        for table, column in ((Result, Result.job_id), (Item, Item.job_id),
                              (ProviderBatchLine, ProviderBatchLine.job_id),
                              (ProviderBatch, ProviderBatch.job_id), (Job, Job.id)):
            session.execute(delete(table).where(column == job_id))

"""The job service: the one place jobs are created, read, cancelled and finished.

The API, the CLI and the workers all come through here, so every view of a
job (REST, CLI, embedded run) reports the same statuses and counts.
"""

import os
import uuid
from datetime import timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session, sessionmaker

from quotaflow import store
from quotaflow.config import Settings
from quotaflow.dispatch.queues import Dispatcher, batch_refs
from quotaflow.errors import JobNotFound, JobStateError
from quotaflow.models import Item, ItemStatus, Job, JobStatus, Result, utcnow
from quotaflow.tenants import audit

# A job may ask for more tries per request than the default, within reason.
MAX_ATTEMPTS_LIMIT = 20


def new_request_id() -> str:
    """An answer's id: 128 random bits as OpenAI's 32 hex digits. Made once per request,
    from os.urandom directly (a uuid4 object cost four times as much)."""
    return f"batch_req_{os.urandom(16).hex()}"


def stable_request_id(job_id: str, line_no: int) -> str:
    """An id for a line that never reached a provider, the same on every download."""
    return f"batch_req_{uuid.uuid5(uuid.NAMESPACE_URL, f'{job_id}/{line_no}').hex}"


def get_job(session: Session, job_id: str, tenant: str | None = None) -> Job:
    """The job; with `tenant`, only if it is that tenant's (another's is "not found")."""
    job = session.get(Job, job_id)
    if job is None or (tenant is not None and job.tenant != tenant):
        raise JobNotFound(f"no job with id {job_id!r}")
    return job


def list_jobs(session: Session, limit: int = 20, after: str | None = None,
              tenant: str | None = None, status: str | None = None,
              queue: str | None = None) -> list[Job]:
    """Newest first; `after` is the id of the last job of the previous page; `status`
    and `queue` keep only the jobs that have them (the same cursor pages them)."""
    query = select(Job).order_by(Job.created_at.desc(), Job.id.desc()).limit(limit)
    if tenant is not None:
        query = query.where(Job.tenant == tenant)
    if status is not None:
        query = query.where(Job.status == status)
    if queue is not None:
        query = query.where(Job.queue == queue)
    if after is not None:
        anchor = get_job(session, after, tenant)
        query = query.where(Job.created_at <= anchor.created_at, Job.id != anchor.id)
    return list(session.scalars(query))


def cancel_job(sessions: sessionmaker[Session], job_id: str,
               actor: audit.Actor | None = None) -> Job:
    """Stop new calls for the job; calls in flight finish and keep their results. The
    actor's cancel is in the audit log (quotaflow/tenants/audit.py) when it took effect."""
    with sessions.begin() as session:
        job = get_job(session, job_id)
        if job.status in (JobStatus.CANCELLING, JobStatus.CANCELLED):
            return job
        if job.status not in JobStatus.ACTIVE:
            raise JobStateError(f"job {job_id} is {job.status} and can no longer be cancelled")
        audit.record(session, actor, "cancel", "job", job_id)
        job.status = JobStatus.CANCELLING
        job.cancelling_at = utcnow()
        session.execute(update(Item)
                        .where(Item.job_id == job_id, Item.is_open,
                               Item.status.in_((ItemStatus.PENDING, ItemStatus.WAITING)))
                        .values(status=ItemStatus.CANCELLED))
    finish_if_done(sessions, job_id)
    with sessions() as session:
        return get_job(session, job_id)


def retry_failed(sessions: sessionmaker[Session], job_id: str, dispatcher: Dispatcher,
                 settings: Settings, actor: audit.Actor | None = None) -> int:
    """Run a job's failed requests again; invalid lines are not retried (they would fail
    the same way). Returns how many requests were queued again (a retry that queued any
    is in the audit log)."""
    with sessions.begin() as session:
        # Held: a retention sweep marking its results deleted waits for, or is seen by, this.
        job = session.get(Job, job_id, with_for_update={"key_share": True}) or get_job(
            session, job_id)
        if job.deleted_at is not None:
            raise JobStateError(f"job {job_id}'s results were deleted; it cannot be retried")
        if job.status not in (JobStatus.IN_PROGRESS, JobStatus.COMPLETED):
            raise JobStateError(f"job {job_id} is {job.status}; only in-progress or completed "
                                "jobs can retry their failed requests")
        failed = (Item.job_id == job_id, Item.status == ItemStatus.FAILED,
                  Item.body.is_not(None))
        # A failed duplicate waits for its original again rather than being sent itself.
        lines = sorted(session.scalars(
            update(Item)
            .where(*failed, Item.duplicate_of.is_(None))
            .values(status=ItemStatus.PENDING, lease_owner=None,
                    lease_expires_at=utcnow() + timedelta(seconds=settings.queue_patience_s))
            .returning(Item.line_no)).all())
        waiting = session.scalars(
            update(Item).where(*failed, Item.duplicate_of.is_not(None))
            .values(status=ItemStatus.WAITING, lease_owner=None, lease_expires_at=None)
            .returning(Item.line_no)).all()
        if not lines and not waiting:
            return 0
        audit.record(session, actor, "retry", "job", job_id)
        session.execute(delete(Result).where(Result.job_id == job_id,
                                             Result.line_no.in_([*lines, *waiting])))
        job.status = JobStatus.IN_PROGRESS
        job.finalizing_at = job.completed_at = None
        job.notified_at = None  # its next end is an event of its own (webhooks)
        queue = job.queue
    dispatcher.dispatch(queue, batch_refs(job_id, lines, settings.batch_size))
    return len(lines) + len(waiting)


def expire_overdue(sessions: sessionmaker[Session]) -> list[str]:
    """Jobs past their completion window: unsent requests expire, the job is `expired`.

    Calls in flight finish and keep their results; partial results stay downloadable.
    """
    now = utcnow()
    with sessions.begin() as session:
        overdue = session.scalars(
            update(Job)
            .where(Job.status == JobStatus.IN_PROGRESS, Job.expires_at < now)
            .values(status=JobStatus.EXPIRED, expired_at=now)
            .returning(Job.id)).all()
        if overdue:
            session.execute(update(Item)
                            .where(Item.job_id.in_(overdue), Item.is_open,
                                   Item.status.in_((ItemStatus.PENDING, ItemStatus.WAITING)))
                            .values(status=ItemStatus.EXPIRED))
    return list(overdue)


def finish_if_done(sessions: sessionmaker[Session], job_id: str) -> None:
    """Move the job to its final status once no item is pending or running."""
    with sessions.begin() as session:
        close_if_done(session, job_id)


def close_if_done(session: Session, job_id: str) -> None:
    """finish_if_done inside the caller's transaction, safe to run from every worker at
    once (the store's close_job)."""
    store.of(session).close_job(session, job_id)

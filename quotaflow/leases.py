"""An item's way through a worker: claimed under a lease, given back, or closed with its result.

Claims are conditional UPDATE ... RETURNING with a lease, so two workers never
run one item at once and a dead worker's items are claimed again once its
lease runs out. Results are insert-or-ignore, so a batch that runs twice
still leaves one result per item.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, exists, func, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.db import insert_ignore
from quotaflow.jobs import BatchRef, new_request_id
from quotaflow.models import Item, ItemStatus, Job, JobStatus, Result, utcnow
from quotaflow.providers import ProviderResponse


@dataclass(frozen=True)
class ClaimedItem:
    line_no: int
    custom_id: str | None
    body: dict[str, Any]
    attempts: int
    body_hash: str | None = None


@dataclass(frozen=True)
class Failure:
    """Why an item failed, as its error line will say."""

    code: str
    message: str
    status_code: int | None = None
    body: dict[str, Any] | None = None
    attempts: int | None = None  # provider calls made, where any were


@dataclass(frozen=True)
class Shared:
    """The answer an identical request got in an earlier job, reused instead of a call."""

    status_code: int | None
    body: dict[str, Any] | None
    source: dict[str, Any]  # {"id", "custom_id", "batch_id"} of the call that was made


Outcome = ProviderResponse | Failure | Shared


def claim(sessions: sessionmaker[Session], ref: BatchRef, owner: str,
          lease: timedelta) -> list[ClaimedItem]:
    """Take the batch's pending items (and items whose lease ran out) for this worker."""
    now = utcnow()
    job_running = exists().where(Job.id == ref.job_id, Job.status == JobStatus.IN_PROGRESS)
    statement = (
        update(Item)
        .where(Item.job_id == ref.job_id,
               Item.line_no.between(ref.first_line, ref.last_line),
               or_(Item.status == ItemStatus.PENDING,
                   and_(Item.status == ItemStatus.RUNNING, Item.lease_expires_at < now)),
               job_running)
        .values(status=ItemStatus.RUNNING, attempts=Item.attempts + 1,
                lease_owner=owner, lease_expires_at=now + lease)
        .returning(Item.line_no, Item.custom_id, Item.body, Item.attempts, Item.body_hash)
    )
    with sessions.begin() as session:
        rows = session.execute(statement).all()
    return sorted((ClaimedItem(*row) for row in rows), key=lambda item: item.line_no)


def release(sessions: sessionmaker[Session], job_id: str, owner: str,
            items: list[ClaimedItem], queued_until: datetime) -> None:
    """Give unstarted items back: they were claimed, but no budget was spent on them.

    `queued_until` is when their retry message, if it never comes, counts as lost.
    """
    with sessions.begin() as session:
        session.execute(
            update(Item)
            .where(Item.job_id == job_id, Item.line_no.in_([i.line_no for i in items]),
                   Item.lease_owner == owner, Item.status == ItemStatus.RUNNING)
            .values(status=ItemStatus.PENDING, lease_owner=None, lease_expires_at=queued_until,
                    attempts=Item.attempts - 1))


def leased_elsewhere_for(sessions: sessionmaker[Session], ref: BatchRef) -> float | None:
    """Seconds until the last foreign lease in the range runs out, or None if none is held."""
    with sessions() as session:
        latest = session.scalar(
            select(func.max(Item.lease_expires_at))
            .where(Item.job_id == ref.job_id,
                   Item.line_no.between(ref.first_line, ref.last_line),
                   Item.status == ItemStatus.RUNNING))
    if latest is None:
        return None
    if latest.tzinfo is None:  # SQLite hands datetimes back without their zone
        latest = latest.replace(tzinfo=utcnow().tzinfo)
    return max(1.0, (latest - utcnow()).total_seconds() + 1.0)


def store(sessions: sessionmaker[Session], job_id: str, item: ClaimedItem,
          outcome: Outcome) -> tuple[bool, int]:
    """Write the item's one result, close the item, and share the result with the
    identical requests waiting for it; (succeeded, how many shared it).

    The result row is insert-or-ignore: if another worker stored first, its
    result stands and the item's status follows the stored row.
    """
    if isinstance(outcome, Failure):
        error: dict[str, Any] = {"code": outcome.code, "line": item.line_no,
                                 "message": outcome.message}
        if outcome.attempts is not None:
            error["attempts"] = outcome.attempts
        values = dict(status_code=outcome.status_code, response=outcome.body, error=error,
                      prompt_tokens=0, completion_tokens=0)
    elif isinstance(outcome, Shared):
        values = dict(status_code=outcome.status_code, response=outcome.body, error=None,
                      prompt_tokens=0, completion_tokens=0, shared_from=outcome.source)
    else:
        values = dict(status_code=outcome.status_code, response=outcome.body, error=None,
                      prompt_tokens=outcome.prompt_tokens,
                      completion_tokens=outcome.completion_tokens)
    with sessions.begin() as session:
        session.execute(insert_ignore(session, Result.__table__).values(
            job_id=job_id, line_no=item.line_no, custom_id=item.custom_id,
            request_id=new_request_id(), created_at=utcnow(), **values))
        stored = session.execute(select(Result).where(
            Result.job_id == job_id, Result.line_no == item.line_no)).scalar_one()
        succeeded = stored.error is None
        session.execute(
            update(Item)
            .where(Item.job_id == job_id, Item.line_no == item.line_no,
                   Item.status.in_(ItemStatus.OPEN))
            .values(status=ItemStatus.SUCCEEDED if succeeded else ItemStatus.FAILED,
                    lease_owner=None, lease_expires_at=None))
        shared = _share(session, job_id, stored)
    return succeeded, shared


def _share(session: Session, job_id: str, original: Result) -> int:
    """Give the items waiting on `original`'s line the same answer; none is billed twice."""
    twins = session.execute(
        update(Item)
        .where(Item.job_id == job_id, Item.duplicate_of == original.line_no,
               Item.status == ItemStatus.WAITING)
        .values(status=ItemStatus.SUCCEEDED if original.error is None else ItemStatus.FAILED)
        .returning(Item.line_no, Item.custom_id)).all()
    source = original.shared_from or {"id": original.request_id,
                                      "custom_id": original.custom_id, "batch_id": job_id}
    for line_no, custom_id in twins:
        error = None if original.error is None else {**original.error, "line": line_no}
        session.execute(insert_ignore(session, Result.__table__).values(
            job_id=job_id, line_no=line_no, custom_id=custom_id,
            request_id=new_request_id(), status_code=original.status_code,
            response=original.response, error=error, prompt_tokens=0, completion_tokens=0,
            shared_from=source, created_at=utcnow()))
    return len(twins)


def renew(sessions: sessionmaker[Session], job_id: str, owner: str, lease: timedelta) -> int:
    """Extend this worker's leases: a live worker's items must never look abandoned."""
    with sessions.begin() as session:
        return session.execute(
            update(Item)
            .where(Item.job_id == job_id, Item.lease_owner == owner,
                   Item.status == ItemStatus.RUNNING)
            .values(lease_expires_at=utcnow() + lease)).rowcount

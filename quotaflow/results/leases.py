"""An item's way through a worker: claimed under a lease, given back, or closed with its result.

Claims are conditional UPDATE ... RETURNING with a lease, so two workers never
run one item at once and a dead worker's items are claimed again once its
lease runs out. Results are insert-or-ignore, so a batch that runs twice
still leaves one result per item.
"""

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, case, exists, select, update
from sqlalchemy.orm import Session, sessionmaker

from quotaflow import store
from quotaflow.dispatch.queues import BatchRef
from quotaflow.jobs.service import new_request_id
from quotaflow.models import Item, ItemStatus, Job, Result, utcnow
from quotaflow.providers.base import ProviderResponse
from quotaflow.providers.outcomes import Outcome, Provenance
from quotaflow.results.rows import result_row
from quotaflow.store.items import ClaimedItem as ClaimedItem

# Core tables, not ORM entities: an ORM-enabled UPDATE costs several times the CPU of
# the same statement on the table, and these run for every batch and chunk.
ITEMS = Item.__table__
RESULTS = Result.__table__
JOBS = Job.__table__

# Given, in the transaction storing a chunk, the answered calls whose rows it inserted:
# a run's hooks (execution/hooks.py, `before_store`) or a spend.Billing bill them there.
OnStored = Callable[[Session, str, list[tuple[ProviderResponse, Provenance]], datetime], None]


def claim(sessions: sessionmaker[Session], ref: BatchRef, owner: str,
          lease: timedelta) -> list[ClaimedItem]:
    """Take the batch's pending items (and items whose lease ran out) for this worker."""
    return store.for_sessions(sessions).claim(sessions, ref, owner, lease)


def release(sessions: sessionmaker[Session], job_id: str, owner: str,
            items: list[ClaimedItem], queued_until: datetime) -> None:
    """Give unstarted items back: they were claimed, but no budget was spent on them.

    `queued_until` is when their retry message, if it never comes, counts as lost.
    """
    with sessions.begin() as session:
        session.execute(
            update(ITEMS)
            .where(ITEMS.c.job_id == job_id, ITEMS.c.line_no.in_([i.line_no for i in items]),
                   ITEMS.c.lease_owner == owner, ITEMS.c.status == ItemStatus.RUNNING)
            .values(status=ItemStatus.PENDING, lease_owner=None, lease_expires_at=queued_until,
                    attempts=ITEMS.c.attempts - 1))


def end_unsent(sessions: sessionmaker[Session], job_id: str, owner: str,
               items: list[ClaimedItem], status: str) -> None:
    """Close claimed items that will not be sent (their job was cancelled or expired);
    their error lines say so (jobs.iter_output)."""
    with sessions.begin() as session:
        session.execute(
            update(ITEMS)
            .where(ITEMS.c.job_id == job_id, ITEMS.c.line_no.in_([i.line_no for i in items]),
                   ITEMS.c.lease_owner == owner, ITEMS.c.status == ItemStatus.RUNNING)
            .values(status=status, lease_owner=None, lease_expires_at=None))


def look_again_in(latest: datetime | None) -> float | None:
    """Seconds until a lease that runs out at `latest` has (None: no lease held)."""
    if latest is None:
        return None
    return max(1.0, (latest - utcnow()).total_seconds() + 1.0)


def store_many(sessions: sessionmaker[Session], job_id: str,
               entries: Sequence[tuple[ClaimedItem, Outcome]],
               share: bool = True,
               provenance: Sequence[Provenance | None] | None = None,
               on_stored: OnStored | None = None) -> tuple[int, int]:
    """Write a chunk of results in one transaction, close their items, and share each
    result with the identical requests waiting for it (unless `share` is False: the
    job has none); (succeeded, failed), the sharers included. `provenance`, one per
    entry where given, says which deployment answered each, after how many calls, when.
    `on_stored` is given the answered calls whose rows this transaction stored (a
    spend.Billing adds them to the spend ledger; a run's hooks, their `before_store`).

    A statement per chunk, not per result: a round trip per answer was most of a
    worker's time. Results are insert-or-ignore, and an item's status follows the
    row that is stored, so when another worker stored first its result stands.
    """
    if not entries:
        return 0, 0
    now = utcnow()
    records = provenance if provenance is not None else (None,) * len(entries)
    rows = [result_row(item.line_no, item.custom_id, outcome, record)
            for (item, outcome), record in zip(entries, records, strict=True)]
    lines = [item.line_no for item, _ in entries]
    with sessions.begin() as session:
        closed = store.of(session).store_chunk(session, job_id, rows, now)
        if on_stored is not None and provenance is not None:
            # An item is open exactly while it has no result (results and the item's
            # closing are one transaction; retrying a line deletes its result first), so
            # the items this statement closed are the rows this transaction inserted:
            # those are billed, and a chunk stored twice is billed once. (Not INSERT ...
            # RETURNING: rendering that per row doubled the write's CPU.)
            on_stored(session, job_id,
                      _answered(entries, provenance, {line for line, _ in closed}), now)
        shared = _share(session, job_id, lines, now) if share else []
    statuses = [status for _, status in closed] + shared
    succeeded = sum(status == ItemStatus.SUCCEEDED for status in statuses)
    return succeeded, len(statuses) - succeeded


def _answered(entries: Sequence[tuple[ClaimedItem, Outcome]],
              provenance: Sequence[Provenance | None],
              inserted: set[int]) -> list[tuple[ProviderResponse, Provenance]]:
    """The answered calls among the rows just inserted: what the provider will bill."""
    return [(outcome, record)
            for (item, outcome), record in zip(entries, provenance, strict=True)
            if record is not None and isinstance(outcome, ProviderResponse)
            and item.line_no in inserted]


# A shared answer's row names no call: it made none.
_NO_PROVENANCE: dict[str, Any] = dict(deployment=None, attempts=None, admitted_at=None,
                                      sent_at=None, answered_at=None, provider_request_id=None)


def _share(session: Session, job_id: str, lines: list[int], now: datetime) -> list[str]:
    """Give the items waiting on these lines the same answers; none is billed twice.

    One UPDATE finds nothing in the common case (no identical requests waiting); the
    stored originals are read only when some are.
    """
    answered = exists().where(RESULTS.c.job_id == job_id,
                              RESULTS.c.line_no == ITEMS.c.duplicate_of)
    twins = session.execute(
        update(ITEMS)
        .where(ITEMS.c.job_id == job_id, ITEMS.c.duplicate_of.in_(lines),
               ITEMS.c.status == ItemStatus.WAITING, answered)
        .values(status=case((answered.where(RESULTS.c.error.is_(None)), ItemStatus.SUCCEEDED),
                            else_=ItemStatus.FAILED))
        .returning(ITEMS.c.line_no, ITEMS.c.custom_id, ITEMS.c.duplicate_of,
                   ITEMS.c.status)).all()
    if not twins:
        return []
    originals = {row.line_no: row for row in session.execute(
        select(RESULTS).where(RESULTS.c.job_id == job_id,
                             RESULTS.c.line_no.in_({twin.duplicate_of for twin in twins})))}
    rows = []
    for line_no, custom_id, duplicate_of, _ in twins:
        original = originals[duplicate_of]
        source = original.shared_from or {"id": original.request_id,
                                          "custom_id": original.custom_id, "batch_id": job_id}
        error = None if original.error is None else {**original.error, "line": line_no}
        rows.append(dict(job_id=job_id, line_no=line_no, custom_id=custom_id,
                         request_id=new_request_id(), status_code=original.status_code,
                         response=original.response, error=error, prompt_tokens=0,
                         completion_tokens=0, shared_from=source, created_at=now,
                         **_NO_PROVENANCE))
    session.execute(store.of(session).insert_ignore(RESULTS), rows)
    return [twin.status for twin in twins]


def renew(sessions: sessionmaker[Session], job_id: str, owner: str, lease: timedelta,
          lines: tuple[int, int] | None = None) -> int:
    """Extend this worker's leases: a live worker's items must never look abandoned.
    `lines` (first, last), the batch's range where known, finds them by primary key
    rather than among all the job's open items."""
    where = [ITEMS.c.job_id == job_id, ITEMS.c.lease_owner == owner,
             ITEMS.c.status == ItemStatus.RUNNING]
    if lines is not None:
        where.append(ITEMS.c.line_no.between(*lines))
    else:
        where.append(ITEMS.c.is_open)
    with sessions.begin() as session:
        return cast("CursorResult[Any]", session.execute(
            update(ITEMS).where(*where).values(lease_expires_at=utcnow() + lease))).rowcount

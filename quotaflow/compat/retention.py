"""The end of a job's results and of an upload: deleted on request, or when they expire.

Deleting is two steps, so it is never left half done and never one giant transaction.
The *mark* is one small transaction: the job becomes a tombstone (`deleted_at`, with its
request counts and usage kept in `tombstone`), and from its commit the results are gone
for every reader (ResultsDeleted, a 404); an upload's mark is its `expires_at` set to now.
The *purge* then removes the rows (results, items with their bodies, provider-batch
lines; an upload's chunks), PURGE_ROWS at a time, each chunk a transaction of its own,
and records `purged_at` (removes the file's row) when none is left. A purge that is cut
off (a crash, a lost connection) is finished by the sweep every worker runs
(workers/reaper.py), which also marks what has expired: a job's output
`output_expires_after_s` after the job ended (the submitter's `output_expires_after`, or
QUOTAFLOW_RESULT_RETENTION_S), an upload at its `expires_at`. Each chunk holds its job's
or file's row with SKIP LOCKED, so sweeps on several workers never work on one at once,
and running one again only finds less to do.

The spend ledger is kept (what was billed stays billed), and so is the job row: its id,
idempotency key and webhooks' history still name it.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    CursorResult,
    Select,
    Table,
    delete,
    exists,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.compat import files
from quotaflow.errors import InvalidParameter, JobNotFound, JobStateError, ResultsDeleted
from quotaflow.jobs import tallies
from quotaflow.jobs import view as job_view
from quotaflow.models import File, FileChunk, Item, ItemStatus, Job, JobStatus, Result, utcnow
from quotaflow.offload import OWNER as PROVIDER_BATCH_OWNER
from quotaflow.offload.batch_tables import ProviderBatch, ProviderBatchLine
from quotaflow.tenants import audit

# OpenAI's bounds for `expires_after` and `output_expires_after`: 1 hour to 30 days.
MIN_EXPIRY_S = 3600
MAX_EXPIRY_S = 30 * 24 * 3600
ANCHOR = "created_at"
# Rows removed per transaction: a million-result job is some 400 short transactions,
# none holding many locks or much WAL at once.
PURGE_ROWS = 5000
# An upload's 1 MiB chunks removed per transaction.
FILE_CHUNKS = 16
# How long a DELETE request purges before it answers; the sweep finishes the rest (the
# data is unreachable from the mark on either way).
INLINE_PURGE_S = 10.0
DELETED = "deleted"
EXPIRED = "expired"
_PER_JOB_TABLES: tuple[Table, ...] = (Result.__table__, Item.__table__,
                                      ProviderBatchLine.__table__)


def expiry_seconds(param: str, anchor: object, seconds: object) -> int:
    """An `expires_after` policy, checked as OpenAI checks it: the anchor `created_at` and
    a whole number of seconds from 3600 to 2592000. The form's values come as text."""
    if anchor != ANCHOR:
        raise InvalidParameter(f"{param}.anchor", f"{param}.anchor must be {ANCHOR!r}, got "
                                                  f"{anchor!r}")
    if isinstance(seconds, str) and seconds.strip().lstrip("-").isdigit():
        seconds = int(seconds.strip())
    if isinstance(seconds, float) and seconds.is_integer():  # JSON's 3600.0 is an integer
        seconds = int(seconds)
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        raise InvalidParameter(f"{param}.seconds", f"{param}.seconds must be a whole number "
                                                   f"of seconds, got {seconds!r}")
    if not MIN_EXPIRY_S <= seconds <= MAX_EXPIRY_S:
        raise InvalidParameter(f"{param}.seconds", f"{param}.seconds must be between "
                                                   f"{MIN_EXPIRY_S} (1 hour) and "
                                                   f"{MAX_EXPIRY_S} (30 days), got {seconds}")
    return seconds


def expires_after(param: str, value: object) -> int | None:
    """`{"anchor": "created_at", "seconds": N}` from a JSON body: N, or None when absent."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"anchor", "seconds"}:
        raise InvalidParameter(param, f'{param} must be an object {{"anchor": "{ANCHOR}", '
                                      f'"seconds": N}}')
    return expiry_seconds(param, value.get("anchor"), value.get("seconds"))


def require_results(job: Job) -> None:
    """Raise ResultsDeleted when the job's results are gone (deleted, or expired)."""
    if job_view.results_gone(job, utcnow()):
        why = (job.tombstone or {}).get("reason", EXPIRED)
        moment = job.deleted_at or job_view.output_expires_at(job)
        raise ResultsDeleted(f"the results of job {job.id} were {why} at "
                             f"{moment:%Y-%m-%d %H:%M:%S} UTC; the job itself is kept")


# --- deleting on request -----------------------------------------------------------

def delete_job(sessions: sessionmaker[Session], job_id: str, tenant: str,
               actor: audit.Actor | None = None) -> Job:
    """Delete a finished job's results and its lines' bodies; the job stays, a tombstone
    (`deleted`), which is returned. Deleting it again returns it again.

    A job still running (or cancelling) is refused (JobStateError, 409): cancel it first,
    as Anthropic asks for its batches; so is a finished one with calls still in flight
    (an expired job's last calls), whose answers would be stored after the purge.
    """
    now = utcnow()
    with sessions.begin() as session:
        job = session.get(Job, job_id, with_for_update={"key_share": True})
        if job is None or job.tenant != tenant:
            raise JobNotFound(f"no job with id {job_id!r}")
        if job.deleted_at is None:
            if job.status not in JobStatus.FINAL:
                raise JobStateError(f"job {job_id} is {job.status}: cancel it first "
                                    f"(POST /jobs/{job_id}/cancel), then delete it once it "
                                    "is cancelled")
            if session.scalar(select(_in_flight(Item.job_id == job_id, now))):
                raise JobStateError(f"job {job_id} has calls still in flight; delete it once "
                                    "they have finished (within QUOTAFLOW_LEASE_S)")
            _mark(session, job, DELETED, now)
            audit.record(session, actor, "delete", "job", job_id)
    purge_job(sessions, job_id, deadline=time.monotonic() + INLINE_PURGE_S)
    with sessions() as session:
        return session.get_one(Job, job_id)


def delete_file(sessions: sessionmaker[Session], file_id: str, tenant: str,
                actor: audit.Actor | None = None) -> None:
    """DELETE /v1/files/{id}: an upload and its bytes; a batch's output or error file
    deletes that batch's results (delete_job): both files are views of them."""
    with sessions() as session:
        virtual = files.virtual_file(session, file_id, tenant)
    if virtual is not None:
        delete_job(sessions, virtual.job_id, tenant, actor)
        return
    now = utcnow()
    with sessions.begin() as session:
        files.get_file(session, file_id, tenant).expires_at = now
        audit.record(session, actor, "delete", "file", file_id)
    deadline = time.monotonic() + INLINE_PURGE_S
    _drain(sessions, _one(File, File.id == file_id, File.expires_at <= now), _purge_file_chunk,
           deadline)


def purge_job(sessions: sessionmaker[Session], job_id: str,
              deadline: float | None = None) -> bool:
    """Remove a marked job's rows a chunk at a time; True once none is left. Stops at
    `deadline` (time.monotonic()), or when another purger holds the job."""
    pick = _one(Job, Job.id == job_id, Job.deleted_at.is_not(None), Job.purged_at.is_(None))
    _drain(sessions, pick, _purge_job_chunk, deadline)
    with sessions() as session:
        return session.scalar(select(Job.purged_at).where(Job.id == job_id)) is not None


# --- the sweep ---------------------------------------------------------------------

@dataclass
class Swept:
    """What one sweep did: jobs whose output expired (marked), files and jobs whose last
    rows it removed, audit events pruned."""

    expired_jobs: list[str] = field(default_factory=list)
    removed_files: int = 0
    purged_jobs: int = 0
    pruned_events: int = 0


def sweep(sessions: sessionmaker[Session], *, budget_s: float,
          now: datetime | None = None, audit_kept_s: int = 0) -> Swept:
    """Mark what has expired, then purge, for about `budget_s` seconds (the rest next
    time), and prune audit events older than `audit_kept_s` (0: kept). Safe on every
    worker at once; PostgreSQL only (SKIP LOCKED, make_interval)."""
    now = now or utcnow()
    deadline = time.monotonic() + budget_s
    swept = Swept()
    ended = func.coalesce(Job.completed_at, Job.cancelled_at, Job.expired_at, Job.failed_at)
    due = _one(Job, Job.deleted_at.is_(None), Job.output_expires_after_s.is_not(None),
               Job.status.in_(JobStatus.FINAL),
               ended + func.make_interval(0, 0, 0, 0, 0, 0, Job.output_expires_after_s) <= now,
               ~_in_flight(Item.job_id == Job.id, now), order=ended)
    while time.monotonic() < deadline:
        with sessions.begin() as session:
            job = session.scalar(due)
            if job is None:
                break
            _mark(session, job, EXPIRED, now)
            swept.expired_jobs.append(job.id)
    swept.removed_files = _drain(sessions, _one(File, File.expires_at <= now,
                                                order=File.expires_at),
                                 _purge_file_chunk, deadline)
    swept.purged_jobs = _drain(sessions, _one(Job, Job.deleted_at.is_not(None),
                                              Job.purged_at.is_(None), order=Job.deleted_at),
                               _purge_job_chunk, deadline)
    while audit_kept_s > 0:  # one batch at least, however the purges spent the time
        with sessions.begin() as session:
            pruned = audit.prune(session, audit_kept_s, now)
        swept.pruned_events += pruned
        if pruned < audit.PRUNE_BATCH or time.monotonic() >= deadline:
            break
    return swept


# --- the parts ---------------------------------------------------------------------

def _mark(session: Session, job: Job, reason: str, now: datetime) -> None:
    """The tombstone: what the job object still reports once its rows are gone."""
    kept = tallies.tallies(session, [job.id])[job.id]
    job.tombstone = {"reason": reason, "counts": tallies.statuses(kept),
                     "usage": list(tallies.usage(kept))}
    job.deleted_at = now


def _in_flight(same_job: ColumnElement[bool], now: datetime) -> ColumnElement[bool]:
    """A call whose answer may still be stored: an item running under a live lease, or
    out at a provider's batch API."""
    return exists().where(same_job, Item.is_open, Item.status == ItemStatus.RUNNING,
                          or_(Item.lease_expires_at > now,
                              Item.lease_owner == PROVIDER_BATCH_OWNER))


def _one(entity: type, *where: ColumnElement[bool], order: Any = None) -> Select[Any]:
    """One row to work on, locked, skipping rows another transaction holds."""
    query: Select[Any] = select(entity).where(*where).limit(1)
    if order is not None:
        query = query.order_by(order)
    # A job row is locked FOR NO KEY UPDATE: results' foreign key checks are not blocked.
    return query.with_for_update(skip_locked=True, key_share=entity is Job)


def _drain(sessions: sessionmaker[Session], pick: Select[Any],
           chunk: Callable[[Session, Any], bool], deadline: float | None) -> int:
    """Chunks, each in a transaction holding the row `pick` finds, until none is left (or
    all are held elsewhere) or the deadline passes; how many rows were finished."""
    finished = 0
    while deadline is None or time.monotonic() < deadline:
        with sessions.begin() as session:
            row = session.scalar(pick)
            if row is None:
                break
            finished += chunk(session, row)
    return finished


def _purge_job_chunk(session: Session, job: Job) -> bool:
    """Up to PURGE_ROWS of a marked job's rows; True (and purged_at) once none is left."""
    left = PURGE_ROWS
    for table in _PER_JOB_TABLES:
        lines = (select(table.c.line_no).where(table.c.job_id == job.id)
                 .order_by(table.c.line_no).limit(left))
        left -= cast("CursorResult[Any]", session.execute(
            delete(table).where(table.c.job_id == job.id, table.c.line_no.in_(lines)))).rowcount
        if left == 0:
            return False
    session.execute(delete(ProviderBatch).where(ProviderBatch.job_id == job.id))
    tallies.forget(session, job.id)  # all zero now; the tombstone keeps the counts
    session.execute(update(Job).where(Job.id == job.id).values(purged_at=utcnow()))
    return True


def _purge_file_chunk(session: Session, row: File) -> bool:
    """Up to FILE_CHUNKS of an expired upload's chunks; the row too once none is left."""
    seqs = (select(FileChunk.seq).where(FileChunk.file_id == row.id)
            .order_by(FileChunk.seq).limit(FILE_CHUNKS))
    removed = cast("CursorResult[Any]", session.execute(
        delete(FileChunk).where(FileChunk.file_id == row.id, FileChunk.seq.in_(seqs)))).rowcount
    if removed == FILE_CHUNKS:
        return False
    session.execute(delete(File).where(File.id == row.id))
    return True

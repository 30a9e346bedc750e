"""The embedded store: SQLite (`quotaflow run`), through portable SQLAlchemy statements.

The same operations as postgres.py, in the same order, by the same rules; a
single-process run needs no prepared text, and SQLite has no json_to_recordset, no
triggers keeping tallies and no advisory locks (it has one writer anyway). Its stamps
come back aware through models.UtcDateTime, as PostgreSQL's do.
"""

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Insert, Table, and_, case, exists, func, or_, select, update
from sqlalchemy.dialects import sqlite
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql.selectable import ScalarSelect

from quotaflow.models import Item, ItemStatus, Job, JobStatus, Result, utcnow
from quotaflow.store import upserts
from quotaflow.store.items import ClaimedItem, LineRange

# Core tables, not ORM entities: an ORM-enabled UPDATE costs several times the CPU of
# the same statement on the table.
ITEMS = Item.__table__
RESULTS = Result.__table__
JOBS = Job.__table__

# The provenance's columns, epoch seconds in a row (results.rows) until stored.
TIMES = ("admitted_at", "sent_at", "answered_at")


class SqliteStore:
    """interface.Store on SQLite (and on any database SQLAlchemy speaks)."""

    keeps_tallies = False
    aggregates = False
    copies = False

    def claim(self, sessions: sessionmaker[Session], ref: LineRange, owner: str,
              lease: timedelta) -> list[ClaimedItem]:
        now = utcnow()
        job_running = exists().where(JOBS.c.id == ref.job_id,
                                     JOBS.c.status == JobStatus.IN_PROGRESS)
        statement = (
            update(ITEMS)
            .where(ITEMS.c.job_id == ref.job_id,
                   ITEMS.c.line_no.between(ref.first_line, ref.last_line),
                   or_(ITEMS.c.status == ItemStatus.PENDING,
                       and_(ITEMS.c.status == ItemStatus.RUNNING,
                            ITEMS.c.lease_expires_at < now)),
                   job_running)
            .values(status=ItemStatus.RUNNING, attempts=ITEMS.c.attempts + 1,
                    lease_owner=owner, lease_expires_at=now + lease)
            .returning(ITEMS.c.line_no, ITEMS.c.custom_id, ITEMS.c.body, ITEMS.c.attempts,
                       ITEMS.c.body_hash, ITEMS.c.route)
        )
        with sessions.begin() as session:
            rows = session.execute(statement).all()
        return sorted((ClaimedItem(*row) for row in rows), key=lambda item: item.line_no)

    def report(self, session: Session, ref: LineRange) -> datetime | None:
        self.close_job(session, ref.job_id)
        latest: datetime | None = session.scalar(
            select(func.max(ITEMS.c.lease_expires_at))
            .where(ITEMS.c.job_id == ref.job_id,
                   ITEMS.c.line_no.between(ref.first_line, ref.last_line),
                   ITEMS.c.status == ItemStatus.RUNNING))
        return latest

    def store_chunk(self, session: Session, job_id: str, rows: Sequence[dict[str, Any]],
                    now: datetime) -> list[tuple[int, str]]:
        # Insert-or-ignore, then close the items after the rows stored, whoever stored them.
        session.execute(self.insert_ignore(RESULTS),
                        [_for_sqlalchemy(row, job_id, now) for row in rows])
        stored = (select(RESULTS.c.error)
                  .where(RESULTS.c.job_id == ITEMS.c.job_id,
                         RESULTS.c.line_no == ITEMS.c.line_no).scalar_subquery())
        return [(line, status) for line, status in session.execute(
            update(ITEMS)
            .where(ITEMS.c.job_id == job_id, ITEMS.c.line_no.in_([r["line_no"] for r in rows]),
                   ITEMS.c.status.in_(ItemStatus.OPEN))
            .values(status=case((stored.is_(None), ItemStatus.SUCCEEDED),
                                else_=ItemStatus.FAILED),
                    lease_owner=None, lease_expires_at=None)
            .returning(ITEMS.c.line_no, ITEMS.c.status))]

    def piece_starts(self, session: Session, job_id: str) -> range | None:
        return None  # output.iter_output writes every line

    def render_piece(self, session: Session, job_id: str, first: int) -> bytes | None:
        return None  # the database makes no lines here: piece_starts is None

    def close_job(self, session: Session, job_id: str) -> None:
        jobs = JOBS.c
        now = utcnow()
        running = jobs.status == JobStatus.IN_PROGRESS
        session.execute(
            update(JOBS)
            .where(jobs.id == job_id,
                   jobs.status.in_((JobStatus.IN_PROGRESS, JobStatus.CANCELLING)),
                   _last_open_line(job_id).is_(None))
            .values(status=case((running, JobStatus.COMPLETED), else_=JobStatus.CANCELLED),
                    finalizing_at=case((running, now), else_=jobs.finalizing_at),
                    completed_at=case((running, now), else_=jobs.completed_at),
                    cancelled_at=case((running, jobs.cancelled_at), else_=now)))

    def lock_tenant(self, session: Session, key: int) -> None:
        return None  # one writer at a time already

    def insert_ignore(self, table: Table) -> Insert:
        return sqlite.insert(table).on_conflict_do_nothing()

    def insert_adding(self, table: Table, keys: Sequence[str], added: Sequence[str],
                      keep_null: Sequence[str] = (), keep: Sequence[str] = ()) -> Insert:
        return upserts.adding(sqlite.insert(table), table, keys, added, keep_null, keep)

    def refresh_statistics(self, sessions: sessionmaker[Session], table: Table) -> None:
        return None  # SQLite plans without them


SQLITE = SqliteStore()


def _last_open_line(job_id: str) -> ScalarSelect[int]:
    """The job's last open line: a backward walk of ix_items_job_open (postgres._CLOSE)."""
    items = ITEMS.c
    return (select(items.line_no).where(items.job_id == job_id, items.is_open)
            .order_by(items.line_no.desc()).limit(1).scalar_subquery())


def _for_sqlalchemy(row: dict[str, Any], job_id: str, now: datetime) -> dict[str, Any]:
    """The row whole, for an INSERT through SQLAlchemy: its job and time added, its
    provenance's times made datetimes."""
    row["job_id"], row["created_at"] = job_id, now
    for name in TIMES:
        if (value := row[name]) is not None:
            row[name] = datetime.fromtimestamp(value, UTC)
    return row

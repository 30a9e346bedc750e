"""A batch's claim and its closing report as two PostgreSQL statements on the driver.

Built with SQLAlchemy, each of these cost a worker more Python than the statement
costs the server: the claim (its UPDATE built, its cache key made, a hundred rows
turned into Row objects and the bodies read through the JSON type), and the report
after each batch (close_if_done and the foreign leases, two statements), each ran once
per batch on the hot path. Here each is one fixed
text that psycopg prepares after a few executions, run on the session's own
connection inside its transaction; the rules are those of leases.claim,
jobs.close_if_done and leases.leased_elsewhere_for, which SQLite keeps using.
"""

from datetime import datetime, timedelta
from typing import Any, cast

import psycopg
from sqlalchemy.orm import Session, sessionmaker

from quotaflow import jsoncodec
from quotaflow.dispatch.queues import BatchRef
from quotaflow.models import ItemStatus, JobStatus, utcnow
from quotaflow.results.leases import ClaimedItem

_CLAIM = (
    "UPDATE items SET status = %(running)s, attempts = attempts + 1, "
    "lease_owner = %(owner)s, lease_expires_at = %(until)s "
    "WHERE job_id = %(job)s AND line_no BETWEEN %(first)s AND %(last)s "
    "AND (status = %(pending)s OR (status = %(running)s AND lease_expires_at < %(now)s)) "
    "AND EXISTS (SELECT 1 FROM jobs WHERE jobs.id = %(job)s AND jobs.status = %(active)s) "
    "RETURNING line_no, custom_id, body::text, attempts, body_hash, route")

# close_if_done (the job ends once it has no open item; a cancelling job is cancelled)
# and the latest foreign lease in the batch's range, in one round trip. A data-modifying
# WITH runs whether or not the SELECT reads it.
_REPORT = (
    "WITH closed AS (UPDATE jobs SET "
    "status = CASE WHEN status = %(active)s THEN %(completed)s ELSE %(cancelled)s END, "
    "finalizing_at = CASE WHEN status = %(active)s THEN %(now)s ELSE finalizing_at END, "
    "completed_at = CASE WHEN status = %(active)s THEN %(now)s ELSE completed_at END, "
    "cancelled_at = CASE WHEN status = %(active)s THEN cancelled_at ELSE %(now)s END "
    "WHERE id = %(job)s AND status IN (%(active)s, %(cancelling)s) "
    "AND (SELECT line_no FROM items WHERE items.job_id = %(job)s AND items.is_open "
    "ORDER BY line_no DESC LIMIT 1) IS NULL RETURNING id) "
    "SELECT max(lease_expires_at) FROM items WHERE job_id = %(job)s "
    "AND line_no BETWEEN %(first)s AND %(last)s AND status = %(running)s")


def claim(sessions: sessionmaker[Session], ref: BatchRef, owner: str,
          lease: timedelta) -> list[ClaimedItem]:
    """leases.claim on PostgreSQL: the batch's pending items, and those whose lease ran
    out, leased to `owner`, in line order."""
    now = utcnow()
    params = {"running": ItemStatus.RUNNING, "pending": ItemStatus.PENDING,
              "active": JobStatus.IN_PROGRESS, "owner": owner, "until": now + lease,
              "now": now, "job": ref.job_id, "first": ref.first_line, "last": ref.last_line}
    with sessions.begin() as session, _cursor(session) as cursor:
        cursor.execute(_CLAIM, params)
        rows = cursor.fetchall()
    bodies = iter(jsoncodec.loads_many([row[2] for row in rows if row[2] is not None]))
    # A pending or running item has a body (only invalid lines have none).
    items = [ClaimedItem(line, custom_id,
                         cast("dict[str, Any]", None if body is None else next(bodies)),
                         attempts, body_hash, route)
             for line, custom_id, body, attempts, body_hash, route in rows]
    items.sort(key=lambda item: item.line_no)
    return items


def report(session: Session, ref: BatchRef) -> datetime | None:
    """Close the job if it has no open item left (jobs.close_if_done), in the session's
    transaction; the latest lease in the batch's range still running, or None."""
    params = {"active": JobStatus.IN_PROGRESS, "cancelling": JobStatus.CANCELLING,
              "completed": JobStatus.COMPLETED, "cancelled": JobStatus.CANCELLED,
              "running": ItemStatus.RUNNING, "now": utcnow(), "job": ref.job_id,
              "first": ref.first_line, "last": ref.last_line}
    with _cursor(session) as cursor:
        cursor.execute(_REPORT, params)
        row = cursor.fetchone()
    return None if row is None else row[0]


def _cursor(session: Session) -> psycopg.Cursor[Any]:
    raw = cast("psycopg.Connection[Any] | None",
               session.connection().connection.driver_connection)
    assert raw is not None
    return raw.cursor()

"""The cluster's store: PostgreSQL, through fixed statements on the driver.

Built with SQLAlchemy, each hot statement cost a worker more Python than it costs the
server (the UPDATE built, its cache key made, the rows made Row objects, the bodies read
through the JSON type). Here each is one fixed text that psycopg prepares after a few
executions, run on the session's own connection inside its transaction. The rules are
those of sqlite.py, operation by operation (tests/cluster/test_batch_sql.py runs both).

The chunk goes as one JSON document read by json_to_recordset, in one statement:
insert-or-ignore the results and close exactly the items whose rows it inserted. An
item is open exactly while it has no result (a result and its item's closing are one
transaction, and a line run again has its result deleted first), so a row that
conflicts belongs to an item already closed by the transaction that stored it.
Downloads' success lines are written by the server too (render_piece), a range of
lines per statement, so Python never handles a line.
"""

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, cast

import orjson
import psycopg
from psycopg.abc import Buffer
from psycopg.adapt import Loader
from sqlalchemy import Insert, Table, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from quotaflow import jsoncodec
from quotaflow.models import ItemStatus, JobStatus, utcnow
from quotaflow.store import upserts
from quotaflow.store.items import ClaimedItem, LineRange

_CLAIM = (
    "UPDATE items SET status = %(running)s, attempts = attempts + 1, "
    "lease_owner = %(owner)s, lease_expires_at = %(until)s "
    "WHERE job_id = %(job)s AND line_no BETWEEN %(first)s AND %(last)s "
    "AND (status = %(pending)s OR (status = %(running)s AND lease_expires_at < %(now)s)) "
    "AND EXISTS (SELECT 1 FROM jobs WHERE jobs.id = %(job)s AND jobs.status = %(active)s) "
    "RETURNING line_no, custom_id, body::text, attempts, body_hash, route")

# The job ends once it has no open item (a cancelling job is cancelled). The last open
# line is a backward walk of ix_items_job_open, not EXISTS: the planner may answer that
# with a scan of all the job's items, and the open items are the newest lines or claims.
_CLOSE = (
    "UPDATE jobs SET "
    "status = CASE WHEN status = %(active)s THEN %(completed)s ELSE %(cancelled)s END, "
    "finalizing_at = CASE WHEN status = %(active)s THEN %(now)s ELSE finalizing_at END, "
    "completed_at = CASE WHEN status = %(active)s THEN %(now)s ELSE completed_at END, "
    "cancelled_at = CASE WHEN status = %(active)s THEN cancelled_at ELSE %(now)s END "
    "WHERE id = %(job)s AND status IN (%(active)s, %(cancelling)s) "
    "AND (SELECT line_no FROM items WHERE items.job_id = %(job)s AND items.is_open "
    "ORDER BY line_no DESC LIMIT 1) IS NULL")

# _CLOSE and the latest foreign lease in the batch's range, in one round trip. A
# data-modifying WITH runs whether or not the SELECT reads it.
_REPORT = (
    "WITH closed AS (" + _CLOSE + " RETURNING id) "
    "SELECT max(lease_expires_at) FROM items WHERE job_id = %(job)s "
    "AND line_no BETWEEN %(first)s AND %(last)s AND status = %(running)s")

# The columns a row (a dict of rows.result_row) gives, with their SQL types. The times
# come as epoch seconds (float8) and are made timestamps by to_timestamp: the rows'
# datetimes cost the worker a conversion and orjson a formatting each, and the server a
# parse of their text.
_COLUMNS = (("line_no", "int4"), ("custom_id", "varchar"), ("request_id", "varchar"),
            ("status_code", "int4"), ("response", "text"), ("error", "jsonb"),
            ("prompt_tokens", "int4"), ("completion_tokens", "int4"),
            ("shared_from", "jsonb"), ("deployment", "varchar"), ("attempts", "int4"),
            ("admitted_at", "float8"), ("sent_at", "float8"),
            ("answered_at", "float8"), ("provider_request_id", "varchar"))
_JSON = frozenset({"response", "error", "shared_from"})
_NAMES = ", ".join(name for name, _ in _COLUMNS)
_VALUES = ", ".join(f"to_timestamp({name})" if kind == "float8" else name
                    for name, kind in _COLUMNS)

# The chunk's line numbers go again as an array for the UPDATE: joined to `stored`
# alone, whose size the planner cannot know (json_to_recordset: 100 rows), a job of some
# thousands of lines had it hash the chunk and read every open item of the job for
# every chunk; with line_no = ANY(lines) it reads the chunk's rows by primary key.
_STORE_CHUNK = (
    "WITH stored AS (INSERT INTO results (job_id, created_at, " + _NAMES + ") "
    "SELECT %s, %s, " + _VALUES + " FROM json_to_recordset(%s::json) AS t("
    + ", ".join(f"{name} {kind}" for name, kind in _COLUMNS) + ") "
    "ON CONFLICT DO NOTHING RETURNING line_no, error IS NULL AS ok), "
    "closed AS (UPDATE items SET status = CASE WHEN stored.ok THEN %s ELSE %s END, "
    "lease_owner = NULL, lease_expires_at = NULL FROM stored "
    "WHERE items.job_id = %s AND items.line_no = ANY(%s::int4[]) "
    "AND items.line_no = stored.line_no "
    "AND items.status = ANY(%s) RETURNING items.line_no, items.status) "
    "SELECT line_no, status FROM closed")

# Lines per piece: about 1.5 MB of text for answers of 700 bytes.
PIECE_LINES = 2000

# output.render_stored's line, for a result without an error, in SQL.
_PIECE = """
SELECT string_agg(
    '{"id":' || to_json(request_id)::text
    || ',"custom_id":' || coalesce(to_json(custom_id)::text, 'null')
    || ',"response":' || CASE WHEN status_code IS NULL THEN 'null' ELSE
        '{"status_code":' || status_code
        || ',"request_id":' || to_json(coalesce(provider_request_id, request_id))::text
        || ',"body":' || coalesce(response::text, 'null') || '}' END
    || ',"error":null'
    || CASE WHEN shared_from IS NULL THEN '}' ELSE ',"shared_from":' || shared_from::text
       || '}' END
    || chr(10), '' ORDER BY line_no)
FROM results
WHERE job_id = %(job)s AND line_no >= %(first)s AND line_no < %(end)s AND error IS NULL
"""
_LAST = "SELECT max(line_no) FROM results WHERE job_id = %(job)s"


class PostgresStore:
    """interface.Store on PostgreSQL."""

    keeps_tallies = True  # migration 0022's triggers
    aggregates = True
    copies = True

    def claim(self, sessions: sessionmaker[Session], ref: LineRange, owner: str,
              lease: timedelta) -> list[ClaimedItem]:
        now = utcnow()
        params = {"running": ItemStatus.RUNNING, "pending": ItemStatus.PENDING,
                  "active": JobStatus.IN_PROGRESS, "owner": owner, "until": now + lease,
                  "now": now, "job": ref.job_id, "first": ref.first_line,
                  "last": ref.last_line}
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

    def report(self, session: Session, ref: LineRange) -> datetime | None:
        params = _closing(ref.job_id) | {"running": ItemStatus.RUNNING,
                                         "first": ref.first_line, "last": ref.last_line}
        with _cursor(session) as cursor:
            cursor.execute(_REPORT, params)
            row = cursor.fetchone()
        return None if row is None else cast("datetime | None", row[0])

    def store_chunk(self, session: Session, job_id: str, rows: Sequence[dict[str, Any]],
                    now: datetime) -> list[tuple[int, str]]:
        # One JSON array of row objects, made by orjson in one call (the answers' own
        # bytes embedded as they came): an array per column cost more than the rest.
        document = orjson.dumps([_json_columns(row) for row in rows])
        with _cursor(session) as cursor:
            cursor.execute(_STORE_CHUNK, (
                job_id, now, document.decode(), ItemStatus.SUCCEEDED, ItemStatus.FAILED,
                job_id, [row["line_no"] for row in rows], list(ItemStatus.OPEN)))
            return [(line, status) for line, status in cursor.fetchall()]

    def piece_starts(self, session: Session, job_id: str) -> range | None:
        # The driver's own SQL: the lines' JSON punctuation (":null") is no bind parameter.
        last = session.connection().exec_driver_sql(_LAST, {"job": job_id}).scalar()
        return range(0, -1 if last is None else last + 1, PIECE_LINES)

    def render_piece(self, session: Session, job_id: str, first: int) -> bytes | None:
        # Taken as the bytes the server sent: decoded to a str and encoded back, a piece
        # cost the API more than half of its CPU per line.
        connection = _connection(session)
        cursor = connection.cursor()
        utf8 = connection.info.encoding == "utf-8"
        if utf8:
            cursor.adapters.register_loader("text", _Utf8Bytes)
        with cursor:
            row = cursor.execute(_PIECE, {"job": job_id, "first": first,
                                          "end": first + PIECE_LINES}).fetchone()
        piece = row[0] if row else None
        if not piece:
            return None
        return cast(bytes, piece if utf8 else piece.encode())

    def close_job(self, session: Session, job_id: str) -> None:
        with _cursor(session) as cursor:
            cursor.execute(_CLOSE, _closing(job_id))

    def lock_tenant(self, session: Session, key: int) -> None:
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})

    def insert_ignore(self, table: Table) -> Insert:
        return postgresql.insert(table).on_conflict_do_nothing()

    def insert_adding(self, table: Table, keys: Sequence[str], added: Sequence[str],
                      keep_null: Sequence[str] = (), keep: Sequence[str] = ()) -> Insert:
        return upserts.adding(postgresql.insert(table), table, keys, added, keep_null, keep)

    def refresh_statistics(self, sessions: sessionmaker[Session], table: Table) -> None:
        """ANALYZE: until autovacuum gets to it (a minute or more), the planner has never
        seen the new job's id and guesses it matches one row; with that guess it may read
        a chunk's rows through any index that starts with job_id, reading the whole job
        for every chunk. A failure leaves the statistics to autovacuum."""
        with sessions() as session:
            try:
                session.execute(text(f"ANALYZE {table.name}"))
                session.commit()
            except DBAPIError:
                session.rollback()


POSTGRES = PostgresStore()


def _closing(job_id: str) -> dict[str, Any]:
    return {"active": JobStatus.IN_PROGRESS, "cancelling": JobStatus.CANCELLING,
            "completed": JobStatus.COMPLETED, "cancelled": JobStatus.CANCELLED,
            "now": utcnow(), "job": job_id}


def _json_columns(row: dict[str, Any]) -> dict[str, Any]:
    """The row, its JSON columns made JSON text in place (NUL-free, numbers kept exact)."""
    for name in _JSON:
        if (value := row[name]) is not None:
            row[name] = orjson.Fragment(jsoncodec.dumps(value))
    return row


def _connection(session: Session) -> psycopg.Connection[Any]:
    raw = cast("psycopg.Connection[Any] | None",
               session.connection().connection.driver_connection)
    assert raw is not None
    return raw


def _cursor(session: Session) -> psycopg.Cursor[Any]:
    return _connection(session).cursor()


class _Utf8Bytes(Loader):
    """A text value as the bytes it arrived in (only where the client encoding is UTF-8)."""

    def load(self, data: Buffer) -> bytes:
        return bytes(data)

"""A chunk of results stored and its items closed in one PostgreSQL statement.

The chunk writer (leases.store_many) used SQLAlchemy's executemany INSERT, which
psycopg runs as one INSERT per row in a pipeline, then an UPDATE of the items:
2 statements and a round trip or two per chunk, a statement execution per result
on the server and SQLAlchemy's compile-and-bind path in the worker. Here the
chunk goes as one JSON document, read by json_to_recordset, through one
statement: insert-or-ignore the results, and close exactly the items whose rows
it inserted. That is the same rule as before: an item is open exactly while it
has no result (a result and its item's closing are one transaction, and a line
run again has its result deleted first), so a row that conflicts belongs to an
item already closed by the transaction that stored it.

It runs on the session's own connection, inside its transaction, and is
prepared by psycopg after a few executions, so the worker only builds the document.
"""

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy.orm import Session

from quotaflow import jsoncodec
from quotaflow.models import ItemStatus

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

# The chunk goes as one JSON array of row objects, made by orjson in one call (the
# answers' own bytes embedded as they came): binding an array per column cost the
# worker more than the rest of the write.
# The chunk's line numbers go again as an array for the UPDATE: joined to `stored`
# alone, whose size the planner cannot know (json_to_recordset: 100 rows), a job of some
# thousands of lines had it hash the chunk and read every open item of the job, for
# every chunk (EXPLAIN, 6,400 lines: 4.9 ms a chunk); with line_no = ANY(lines) it reads
# the chunk's rows by primary key (1.9 ms). Larger jobs were already planned that way.
_STATEMENT = (
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


def supported(session: Session) -> bool:
    """Whether the session's database takes the one-statement write (PostgreSQL)."""
    return session.get_bind().dialect.name == "postgresql"


def store_chunk(session: Session, job_id: str, rows: Sequence[dict[str, Any]],
                now: datetime) -> list[tuple[int, str]]:
    """Insert the rows that are not stored yet and close their items, in the session's
    transaction; (line_no, status) of each item closed, i.e. of each row inserted."""
    document = orjson.dumps([_json_columns(row) for row in rows])
    raw = session.connection().connection.driver_connection
    assert raw is not None
    with raw.cursor() as cursor:
        cursor.execute(_STATEMENT, (job_id, now, document.decode(), ItemStatus.SUCCEEDED,
                                    ItemStatus.FAILED, job_id, [row["line_no"] for row in rows],
                                    list(ItemStatus.OPEN)))
        return [(line, status) for line, status in cursor.fetchall()]


def _json_columns(row: dict[str, Any]) -> dict[str, Any]:
    """The row, its JSON columns made JSON text in place (NUL-free, numbers kept exact)."""
    for name in _JSON:
        if (value := row[name]) is not None:
            row[name] = orjson.Fragment(jsoncodec.dumps(value))
    return row

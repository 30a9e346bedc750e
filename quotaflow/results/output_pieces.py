"""A job's output file as pieces of bytes, the lines written by PostgreSQL where it can.

output.iter_output renders each line in Python around the stored JSON text; at a
million lines that loop (a row object, three orjson calls and an f-string a
line) was the download's ceiling, about 95,000 lines/s. For the common download,
a finished or running OpenAI-format job's successes from PostgreSQL, the server
writes the same lines (to_json of the strings, the stored JSON as text) and
joins a range of them per statement, so Python handles a piece of
PIECE_LINES lines at a time and never a line. Everything else (error lines,
Anthropic-format jobs, SQLite) goes through output.iter_output unchanged.
Lines come in input order; pieces are ranges of line numbers walked by the
primary key, so memory holds one piece whatever the job's size.
"""

import threading
from collections.abc import Iterator
from typing import Any, cast

import psycopg
from psycopg.abc import Buffer
from psycopg.adapt import Loader
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.constants import OUTPUT_ANTHROPIC
from quotaflow.jobs.service import get_job
from quotaflow.results.output import iter_output, output_chunks
from quotaflow.results.read_ahead import made_in_parallel, read_ahead

# Lines per statement: about 1.5 MB of text for answers of 700 bytes.
PIECE_LINES = 2000
# Connections writing a download's pieces at once (output_stream), and how many
# downloads of a process may take more than one at a time.
PIECE_WORKERS = 2
PARALLEL_DOWNLOADS = 2
_SECOND_CONNECTIONS = threading.BoundedSemaphore(PARALLEL_DOWNLOADS)

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


def output_pieces(session: Session, job_id: str, errors: bool) -> Iterator[bytes]:
    """The job's output (or error) file in input order, as pieces of bytes."""
    starts = piece_starts(session, job_id, errors)
    if starts is None:
        yield from output_chunks(iter_output(session, job_id, errors=errors))
        return
    for first in starts:
        if piece := render_piece(session, job_id, first):
            yield piece


def output_stream(sessions: sessionmaker[Session], job_id: str, errors: bool,
                  workers: int = PIECE_WORKERS) -> Iterator[bytes]:
    """output_pieces made ahead of the one being sent (read_ahead.py): the pieces
    PostgreSQL writes on `workers` connections at once, one core each (one connection
    made about 140,000 lines/s, two about 270,000 on a 2-core machine), the rest on one
    thread."""
    with sessions() as session:
        starts = piece_starts(session, job_id, errors)
    if starts is None:
        def chunks() -> Iterator[bytes]:
            with sessions() as session:
                yield from output_pieces(session, job_id, errors=errors)
        yield from read_ahead(chunks)
        return
    # The API's connection pool is small (quotaflow/db.py): a few downloads at a time
    # take a second connection, the others make do with one.
    extra = workers > 1 and _SECOND_CONNECTIONS.acquire(blocking=False)
    try:
        yield from made_in_parallel(
            starts, lambda session, first: render_piece(session, job_id, first), sessions,
            workers=workers if extra else 1)
    finally:
        if extra:
            _SECOND_CONNECTIONS.release()


def piece_starts(session: Session, job_id: str, errors: bool) -> range | None:
    """The first line of each piece PostgreSQL writes, or None where Python writes the
    lines (error files, Anthropic-format jobs, SQLite)."""
    if (errors or session.get_bind().dialect.name != "postgresql"
            or get_job(session, job_id).output_format == OUTPUT_ANTHROPIC):
        return None
    # The driver's own SQL: the lines' JSON punctuation (":null") is no bind parameter.
    last = session.connection().exec_driver_sql(_LAST, {"job": job_id}).scalar()
    return range(0, -1 if last is None else last + 1, PIECE_LINES)


def render_piece(session: Session, job_id: str, first: int) -> bytes | None:
    """The output lines of the job's successes from line `first` on (PIECE_LINES
    line numbers), made by PostgreSQL; None if that range has none. The piece is taken
    as the bytes the server sent: decoded to a str and encoded back, it cost the API
    more than half of its CPU per line (0.7 against 0.3 s for 400,000 lines)."""
    connection = cast("psycopg.Connection[Any]",
                      session.connection().connection.driver_connection)
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


class _Utf8Bytes(Loader):
    """A text value as the bytes it arrived in (only where the client encoding is UTF-8)."""

    def load(self, data: Buffer) -> bytes:
        return bytes(data)

"""A job's output file as pieces of bytes, the lines written by PostgreSQL where it can.

output.iter_output renders each line in Python around the stored JSON text; at a
million lines that loop (a row object, three orjson calls and an f-string a
line) was the download's ceiling, about 95,000 lines/s. For the common download,
a finished or running OpenAI-format job's successes from PostgreSQL, the server
writes the same lines (to_json of the strings, the stored JSON as text) and
joins a range of them per statement (the store's render_piece, store/postgres.py), so
Python handles a piece of PIECE_LINES lines at a time and never a line. Everything else
(error lines, Anthropic-format jobs, SQLite) goes through output.iter_output unchanged.
Lines come in input order; pieces are ranges of line numbers walked by the
primary key, so memory holds one piece whatever the job's size.
"""

import threading
from collections.abc import Iterator

from sqlalchemy.orm import Session, sessionmaker

from quotaflow import store
from quotaflow.constants import OUTPUT_ANTHROPIC
from quotaflow.jobs.service import get_job
from quotaflow.results.output import iter_output, output_chunks
from quotaflow.results.read_ahead import made_in_parallel, read_ahead

# Connections writing a download's pieces at once (output_stream), and how many
# downloads of a process may take more than one at a time.
PIECE_WORKERS = 2
PARALLEL_DOWNLOADS = 2
_SECOND_CONNECTIONS = threading.BoundedSemaphore(PARALLEL_DOWNLOADS)


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
    """The first line of each piece the database writes, or None where Python writes the
    lines (error files, Anthropic-format jobs, SQLite)."""
    if errors or get_job(session, job_id).output_format == OUTPUT_ANTHROPIC:
        return None
    return store.of(session).piece_starts(session, job_id)


def render_piece(session: Session, job_id: str, first: int) -> bytes | None:
    """The output lines of the job's successes from line `first` on, made by the database
    (store.postgres); None if that range has none."""
    return store.of(session).render_piece(session, job_id, first)

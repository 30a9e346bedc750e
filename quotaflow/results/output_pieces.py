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

from collections.abc import Iterator

from sqlalchemy.orm import Session

from quotaflow.constants import OUTPUT_ANTHROPIC
from quotaflow.jobs.service import get_job
from quotaflow.results.output import iter_output, output_chunks

# Lines per statement: about 1.5 MB of text for answers of 700 bytes.
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


def output_pieces(session: Session, job_id: str, errors: bool) -> Iterator[bytes]:
    """The job's output (or error) file in input order, as pieces of bytes."""
    if (errors or session.get_bind().dialect.name != "postgresql"
            or get_job(session, job_id).output_format == OUTPUT_ANTHROPIC):
        yield from output_chunks(iter_output(session, job_id, errors=errors))
        return
    # The driver's own SQL: the lines' JSON punctuation (":null") is no bind parameter.
    connection = session.connection()
    last = connection.exec_driver_sql(_LAST, {"job": job_id}).scalar()
    if last is None:
        return
    for first in range(0, last + 1, PIECE_LINES):
        piece = connection.exec_driver_sql(_PIECE, {"job": job_id, "first": first,
                                                    "end": first + PIECE_LINES}).scalar()
        if piece:
            yield piece.encode()

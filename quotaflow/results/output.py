"""OpenAI batch output and error lines, and the stream they are downloaded in.

A result's stored JSON (response, error, shared_from) comes out of the database
as text and is spliced into its line as it is (render_stored): a download of a
million lines never parses and re-serialises a million response bodies. A job
whose output format is Anthropic's gets Message Batches result lines instead
(render_anthropic): its answers were stored as Messages, so they splice as well;
only its error lines, the few, are parsed to be made over.
"""

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import orjson
from sqlalchemy import Text, and_, cast, or_, select
from sqlalchemy.orm import Session

from quotaflow.constants import OUTPUT_ANTHROPIC
from quotaflow.jobs.service import get_job, stable_request_id
from quotaflow.models import Item, Result
from quotaflow.providers.anthropic_answers import error_object
from quotaflow.providers.outcomes import NOT_SENT_BECAUSE, UNSENT_CODES

# Rows fetched per round trip when results are downloaded.
OUTPUT_ROWS = 2000


def output_line(
    request_id: str,
    custom_id: str | None,
    status_code: int | None,
    response: dict[str, Any] | None,
    error: dict[str, Any] | None,
    shared_from: dict[str, Any] | None = None,
    provider_request_id: str | None = None,
) -> dict[str, Any]:
    """One line of an OpenAI batch output or error file; `shared_from` (quotaflow's own
    key) names the identical request whose answer this line shares. The line's `id` is
    ours; `response.request_id` is the provider's x-request-id, as in OpenAI's output,
    where the provider gave one."""
    line = {
        "id": request_id,
        "custom_id": custom_id,
        "response": None if status_code is None else {
            "status_code": status_code,
            "request_id": provider_request_id or request_id,
            "body": response,
        },
        "error": error,
    }
    if shared_from is not None:
        line["shared_from"] = shared_from
    return line


def dumps_line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"


def render_stored(request_id: str, custom_id: str | None, status_code: int | None,
                  response: str | None, error: str | None, shared_from: str | None,
                  provider_request_id: str | None = None) -> str:
    """output_line's shape, written around JSON that is already text."""
    rid = orjson.dumps(request_id).decode()
    cid = "null" if custom_id is None else orjson.dumps(custom_id).decode()
    pid = rid if provider_request_id is None else orjson.dumps(provider_request_id).decode()
    answer = "null" if status_code is None else (
        f'{{"status_code":{status_code},"request_id":{pid},"body":{response or "null"}}}')
    tail = "}\n" if shared_from is None else f',"shared_from":{shared_from}}}\n'
    return f'{{"id":{rid},"custom_id":{cid},"response":{answer},"error":{error or "null"}{tail}'


# A line's error code -> the Message Batches result type of a line that got no answer.
_UNANSWERED = {"batch_cancelled": "canceled", "batch_expired": "expired"}


def render_anthropic(request_id: str, custom_id: str | None, status_code: int | None,
                     response: str | None, error: str | None, *_rest: object) -> str:
    """One Message Batches result line: succeeded with its Message, or errored (Anthropic's
    error object), canceled or expired."""
    cid = "null" if custom_id is None else orjson.dumps(custom_id).decode()
    if error is None:
        return (f'{{"custom_id":{cid},"result":{{"type":"succeeded",'
                f'"message":{response or "null"}}}}}\n')
    failure = orjson.loads(error)
    kind = _UNANSWERED.get(str(failure.get("code")))
    if kind is not None:
        return f'{{"custom_id":{cid},"result":{{"type":"{kind}"}}}}\n'
    body = orjson.loads(response) if response else None
    result = {"type": "errored",
              "error": error_object(status_code, str(failure.get("message", "")), body,
                                    str(failure.get("code")))}
    return f'{{"custom_id":{cid},"result":{orjson.dumps(result).decode()}}}\n'


def output_chunks(lines: Iterable[str], size: int = 64 * 1024) -> Iterator[bytes]:
    """Lines joined into pieces of about `size` bytes: a streaming response hands each
    piece to the event loop from a thread, which per line would cost more than the line."""
    pending: list[str] = []
    held = 0
    for line in lines:
        pending.append(line)
        held += len(line)
        if held >= size:
            yield "".join(pending).encode()
            pending, held = [], 0
    if pending:
        yield "".join(pending).encode()


def iter_output(session: Session, job_id: str, errors: bool) -> Iterator[str]:
    """Result lines in input order: successes, or everything that did not succeed.

    Works while the job runs, so partial results can be downloaded. Only the needed
    rows and columns are read, through a server-side cursor, and the stored JSON comes
    back as text spliced into the line as it is, never parsed and written again.
    """
    render = (render_anthropic if get_job(session, job_id).output_format == OUTPUT_ANTHROPIC
              else render_stored)
    stored = (Result.request_id, Result.custom_id, Result.status_code,
              cast(Result.response, Text), cast(Result.error, Text),
              cast(Result.shared_from, Text), Result.provider_request_id)
    if not errors:
        query = (select(Result.line_no, *stored)
                 .where(Result.job_id == job_id, Result.error.is_(None)))
        # Rows of the columns above, in order: the renderers' arguments.
        succeeded: Iterable[Sequence[Any]] = session.execute(
            query.order_by(Result.line_no).execution_options(yield_per=OUTPUT_ROWS))
        for _line, *row in succeeded:
            yield render(*row)
        return
    unsent = tuple(UNSENT_CODES)
    failed = (select(Item.line_no, Item.custom_id, Item.status, Result.line_no, *stored)
              .outerjoin(Result, (Result.job_id == Item.job_id) & (Result.line_no == Item.line_no))
              .where(Item.job_id == job_id,
                     or_(Result.error.is_not(None),
                         and_(Result.line_no.is_(None), Item.status.in_(unsent)))))
    rows: Iterable[Sequence[Any]] = session.execute(
        failed.order_by(Item.line_no).execution_options(yield_per=OUTPUT_ROWS))
    for line_no, custom_id, status, result_line, *row in rows:
        if result_line is not None:
            yield render(*row)
            continue
        error = {"code": str(UNSENT_CODES[status]), "line": line_no,
                 "message": f"line {line_no}: not sent because {NOT_SENT_BECAUSE[status]}"}
        request_id = stable_request_id(job_id, line_no)
        if render is render_anthropic:
            yield render_anthropic(request_id, custom_id, None, None,
                                   orjson.dumps(error).decode())
            continue
        yield dumps_line(output_line(request_id, custom_id, None, None, error))

"""OpenAI batch output and error lines, and the stream they are downloaded in.

A result's stored JSON (response, error, shared_from) comes out of the database
as text and is spliced into its line as it is (render_stored): a download of a
million lines never parses and re-serialises a million response bodies.
"""

import json
from collections.abc import Iterable, Iterator
from typing import Any

import orjson


def output_line(
    request_id: str,
    custom_id: str | None,
    status_code: int | None,
    response: dict[str, Any] | None,
    error: dict[str, Any] | None,
    shared_from: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One line of an OpenAI batch output or error file; `shared_from` (quotaflow's own
    key) names the identical request whose answer this line shares."""
    line = {
        "id": request_id,
        "custom_id": custom_id,
        "response": None if status_code is None else {
            "status_code": status_code,
            "request_id": request_id,
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
                  response: str | None, error: str | None, shared_from: str | None) -> str:
    """output_line's shape, written around JSON that is already text."""
    rid = orjson.dumps(request_id).decode()
    cid = "null" if custom_id is None else orjson.dumps(custom_id).decode()
    answer = "null" if status_code is None else (
        f'{{"status_code":{status_code},"request_id":{rid},"body":{response or "null"}}}')
    tail = "}\n" if shared_from is None else f',"shared_from":{shared_from}}}\n'
    return f'{{"id":{rid},"custom_id":{cid},"response":{answer},"error":{error or "null"}{tail}'


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

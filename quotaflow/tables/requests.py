"""Rows to OpenAI Batch lines: one /v1/chat/completions request per row.

The template makes the user message; the rest of the body is the same for every row
(model, system message, max_tokens, response_format). custom_id is the id column's
value, or the row's number where no id column is named, so a row and its answer meet
again by it (quotaflow/tables/join.py). The lines are written to a JSONL file that
ingest then reads as any other, which keeps one way in and lets a row that fails stop
the whole conversion before anything is sent.
"""

import contextlib
import json
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from quotaflow.constants import ENDPOINT_CHAT
from quotaflow.errors import InvalidParameter, RowError, TableError
from quotaflow.tables.sources import RowSource
from quotaflow.tables.templates import PromptTemplate

_SCHEMA_NAME = re.compile(r"[^a-zA-Z0-9_-]")


@dataclass(frozen=True)
class RequestShape:
    """What every row's request shares; None leaves a field out of the body."""

    model: str | None = None
    system: str | None = None
    max_tokens: int | None = None
    response_format: dict[str, Any] | None = None
    id_column: str | None = None


def response_format(schema: dict[str, Any], name: str = "answer") -> dict[str, Any]:
    """OpenAI's `response_format` from a JSON Schema file's content: a bare schema is
    wrapped as `json_schema` named `name`; OpenAI's own forms (`{"type": "json_schema",
    ...}`, or `{"name", "schema", "strict"}`) are taken as written."""
    if not isinstance(schema, dict):
        raise InvalidParameter("response_format", "the response format must be a JSON object "
                                                  "(a JSON Schema)")
    if "type" in schema and schema["type"] in ("json_schema", "json_object", "text"):
        return schema
    if isinstance(schema.get("schema"), dict) and "name" in schema:
        return {"type": "json_schema", "json_schema": schema}
    return {"type": "json_schema",
            "json_schema": {"name": _SCHEMA_NAME.sub("_", name)[:64] or "answer",
                            "schema": schema}}


def load_response_format(path: Path) -> dict[str, Any]:
    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InvalidParameter("response_format", f"cannot read {path} as JSON: {exc}") from None
    return response_format(schema, path.stem)


def row_custom_id(row: dict[str, Any], row_no: int, id_column: str | None) -> str:
    """The row's custom_id: its id column's value as text, or its number."""
    if id_column is None:
        return str(row_no)
    value = row.get(id_column)
    if value is None or value == "":
        raise RowError(row_no, id_column, "has no value in the id column")
    return str(value)


def check_id_column(source: RowSource, id_column: str | None) -> None:
    if id_column is None:
        return
    columns = source.columns()
    if id_column not in columns:
        raise TableError(f"{source.name} has no column {id_column!r} to take ids from "
                         f"(its columns: {', '.join(map(repr, columns)) or 'none'})")


def request_lines(source: RowSource, template: PromptTemplate,
                  shape: RequestShape) -> Iterator[bytes]:
    """One JSONL line per row, in order; raises RowError at the first row that fails."""
    check_id_column(source, shape.id_column)
    base: dict[str, Any] = {}
    if shape.model is not None:
        base["model"] = shape.model
    if shape.max_tokens is not None:
        base["max_tokens"] = shape.max_tokens
    if shape.response_format is not None:
        base["response_format"] = shape.response_format
    system = [{"role": "system", "content": shape.system}] if shape.system else []
    row_no = 0
    for rows in source.row_batches():
        for row in rows:
            row_no += 1
            custom_id = row_custom_id(row, row_no, shape.id_column)
            prompt = template.render(row, row_no)
            body = {**base, "messages": [*system, {"role": "user", "content": prompt}]}
            yield orjson.dumps({"custom_id": custom_id, "method": "POST", "url": ENDPOINT_CHAT,
                                "body": body}, default=str) + b"\n"


def write_requests(source: RowSource, template: PromptTemplate, shape: RequestShape,
                   out: IO[bytes]) -> int:
    """Every row's line written to `out`; the number of rows."""
    count = 0
    for line in request_lines(source, template, shape):
        out.write(line)
        count += 1
    if count == 0:
        raise TableError(f"{source.name} has no rows")
    return count


@contextlib.contextmanager
def requests_file(source: RowSource, template: PromptTemplate,
                  shape: RequestShape) -> Iterator[Path]:
    """The rows' lines in a temporary JSONL file, removed on leaving: every row is made
    into its request before anything is sent, so a row that fails leaves nothing
    half-submitted, and a submit retried after a timeout sends the same bytes again."""
    handle, name = tempfile.mkstemp(prefix="quotaflow-", suffix=".jsonl")
    path = Path(name)
    try:
        with os.fdopen(handle, "wb") as out:
            write_requests(source, template, shape, out)
        yield path
    finally:
        path.unlink(missing_ok=True)

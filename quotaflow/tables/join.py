"""A job's answers joined to its input rows, in input order, a batch at a time.

The input's columns come from reading the input table again beside the output, not
from the job: a row's columns are never sent or stored with its request (the database
would keep every table's columns twice over, and the provider needs only the prompt).
Both are in input order, one line per row, so the join is a walk down both: each row's
custom_id (its id column, or its number, as tables/requests.py made it) is matched
against the next output line and the next error line. Memory holds one batch of rows,
whatever the job's size. A line left over once the rows are done means the table is
not the one the job was made from, which is said rather than written as a table with
holes.
"""

from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa

from quotaflow.errors import TableError
from quotaflow.tables.answers import ANSWER_FIELDS, answer
from quotaflow.tables.requests import check_id_column, row_custom_id
from quotaflow.tables.sources import RowSource


class _Lines:
    """An ordered stream of output lines with its next line at hand."""

    def __init__(self, lines: Iterable[dict[str, Any]]) -> None:
        self._lines = iter(lines)
        self.head: dict[str, Any] | None = next(self._lines, None)

    def take_if(self, custom_id: str, row_no: int) -> dict[str, Any] | None:
        head = self.head
        if head is None:
            return None
        found = head.get("error")
        error: dict[str, Any] = found if isinstance(found, dict) else {}
        if head.get("custom_id") == custom_id or (
                head.get("custom_id") is None and error.get("line") == row_no):
            self.head = next(self._lines, None)
            return head
        return None


def joined_batches(source: RowSource, id_column: str | None,
                   results: Iterable[dict[str, Any]],
                   errors: Iterable[dict[str, Any]]) -> Iterator[pa.RecordBatch]:
    """The input's batches, each with the answer columns added."""
    check_id_column(source, id_column)
    done, failed = _Lines(results), _Lines(errors)
    fields: list[pa.Field] | None = None
    row_no = 0
    for batch in source.arrow_batches():
        if fields is None:
            fields = _answer_fields(batch.schema.names, source.name)
        # the id column alone as Python values: the rest of the row stays in Arrow
        ids = batch.column(id_column).to_pylist() if id_column else None
        answers: list[dict[str, Any]] = []
        for index in range(batch.num_rows):
            row_no += 1
            custom_id = (row_custom_id({id_column: ids[index]}, row_no, id_column)
                         if ids is not None and id_column else str(row_no))
            line = done.take_if(custom_id, row_no) or failed.take_if(custom_id, row_no)
            answers.append(answer(line) | {"custom_id": custom_id})
        arrays = [pa.array([a[f.name] for a in answers], f.type) for f in fields]
        yield pa.RecordBatch.from_arrays([*batch.columns, *arrays],
                                         schema=pa.schema([*batch.schema, *fields]))
    left = done.head or failed.head
    if left is not None:
        raise TableError(f"the job has an answer for custom_id {left.get('custom_id')!r} that "
                         f"{source.name} has no row for (after its {row_no:,} rows): is it "
                         "the table the job was made from, with the same id column?")


def _answer_fields(names: list[str], table: str) -> list[pa.Field]:
    """The answer columns; custom_id only where the input has none of its own."""
    fields = [f for f in ANSWER_FIELDS if not (f.name == "custom_id" and f.name in names)]
    taken = [f.name for f in fields if f.name in names]
    if taken:
        raise TableError(f"{table} has columns named as the answer columns "
                         f"({', '.join(map(repr, taken))}): rename them")
    return fields

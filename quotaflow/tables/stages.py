"""Stages: a previous job's answers as the rows of the next job.

A generate-then-judge pipeline is two jobs: the second's template renders over each of
the first's rows, which hold the first's input columns (where it was made from a table:
the join of tables/join.py) and its answer: custom_id, response_text, response_json,
prompt_tokens, completion_tokens, finish_reason, error. custom_id carries over, so a row
keeps its id through every stage. A row whose answer failed is left out unless asked
for: a judge of an empty answer judges nothing.

The rows are read again from the previous job whenever they are needed (the next job's
requests made, later its answers joined back), never stored: a stage job keeps only the
previous job's id in its metadata, and a stage of a stage finds its rows by walking back.
How the jobs and their lines are fetched (HTTP, or the engine in this process) is the
caller's: this module sees two functions.
"""

import itertools
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from quotaflow.constants import FINAL_STATUSES
from quotaflow.errors import JobStateError, TableError
from quotaflow.tables import ID_COLUMN_KEY, INPUT_KEY
from quotaflow.tables.answers import ANSWER_FIELDS, ANSWER_NAMES, answer
from quotaflow.tables.join import joined_batches
from quotaflow.tables.sources import BATCH_ROWS, RowSource, open_table
from quotaflow.tables.storage import is_url

# What a stage job keeps in its metadata: the previous job, and whether failed rows came.
AFTER_KEY = "quotaflow_after"
PREVIOUS = "previous_"
INCLUDE_FAILED_KEY = "quotaflow_include_failed"
STAGE_ID_COLUMN = "custom_id"

FetchJob = Callable[[str], dict[str, Any]]
FetchLines = Callable[[str, bool], Iterable[dict[str, Any]]]


class StageRows(RowSource):
    """The previous job's rows with its answers, in its input order."""

    def __init__(self, job_id: str, table: RowSource | None, id_column: str | None,
                 lines: FetchLines, include_failed: bool = False) -> None:
        self.job_id, self.name = job_id, f"job {job_id}'s results"
        self._table, self._id_column = table, id_column
        self._lines, self.include_failed = lines, include_failed

    def columns(self) -> list[str]:
        names = self._table.columns() if self._table is not None else []
        return [*names, *(name for name in ANSWER_NAMES if name not in names)]

    def for_join(self) -> RowSource:
        """These rows as the input of the next job's table out: its answer columns
        (custom_id aside) become previous_response_text, ..., beside the new answers."""
        return PreviousAnswers(self)

    def arrow_batches(self) -> Iterator[pa.RecordBatch]:
        for batch in self._answered():
            if not self.include_failed:
                batch = batch.filter(pc.is_null(batch.column("error")))
            if batch.num_rows:
                yield batch

    def _answered(self) -> Iterator[pa.RecordBatch]:
        results, errors = self._lines(self.job_id, False), self._lines(self.job_id, True)
        if self._table is not None:
            yield from joined_batches(self._table, self._id_column, results, errors)
            return
        # A job of ready-made requests: its answered lines in their order, then (asked
        # for) its failed ones; a line that never became a request has no id to carry.
        lines: Iterable[dict[str, Any]] = results
        if self.include_failed:
            lines = itertools.chain(results, errors)
        schema = pa.schema(ANSWER_FIELDS)
        rows: list[dict[str, Any]] = []
        for line in lines:
            if line.get("custom_id") is None:
                continue
            rows.append(answer(line))
            if len(rows) == BATCH_ROWS:
                yield pa.RecordBatch.from_pylist(rows, schema=schema)
                rows = []
        if rows:
            yield pa.RecordBatch.from_pylist(rows, schema=schema)


def job_rows(job: dict[str, Any], fetch_job: FetchJob,
             fetch_lines: FetchLines) -> RowSource | None:
    """The rows a job was made from, where they can be had: its table (by the path or
    URL its metadata keeps), or for a stage the previous job's rows with their answers.
    None for a job of ready-made requests."""
    metadata = job.get("metadata") or {}
    after = metadata.get(AFTER_KEY)
    if after:
        return stage_rows(fetch_job(after), fetch_job, fetch_lines,
                          metadata.get(INCLUDE_FAILED_KEY) == "true").for_join()
    kept = metadata.get(INPUT_KEY)
    if not kept:
        return None
    if not is_url(kept) and not Path(kept).is_file():
        raise TableError(f"job {job['id']} was made from {kept}, which is not on this machine")
    return open_table(kept)


def stage_rows(previous: dict[str, Any], fetch_job: FetchJob, fetch_lines: FetchLines,
               include_failed: bool = False) -> StageRows:
    """The rows of a stage after `previous` (a job object): refused while it runs."""
    if previous["status"] not in FINAL_STATUSES:
        raise JobStateError(f"job {previous['id']} is {previous['status']}: a stage after it "
                            "takes its results once it has ended (quotaflow status "
                            f"{previous['id']} --watch)")
    table = job_rows(previous, fetch_job, fetch_lines)
    id_column = (previous.get("metadata") or {}).get(ID_COLUMN_KEY)
    return StageRows(previous["id"], table, id_column, fetch_lines, include_failed)


def stage_metadata(previous_id: str, include_failed: bool) -> dict[str, str]:
    """What a stage job keeps to find its rows again."""
    found = {AFTER_KEY: previous_id, ID_COLUMN_KEY: STAGE_ID_COLUMN}
    return found | ({INCLUDE_FAILED_KEY: "true"} if include_failed else {})


class PreviousAnswers(RowSource):
    """A stage's rows with their answer columns renamed previous_*; the previous_* of
    the stage before (a stage of a stage) are left out: they are in its own table."""

    def __init__(self, rows: StageRows) -> None:
        self.rows, self.name = rows, rows.name

    def columns(self) -> list[str]:
        return _renamed(self.rows.columns())

    def arrow_batches(self) -> Iterator[pa.RecordBatch]:
        for batch in self.rows.arrow_batches():
            names = batch.schema.names
            kept = [i for i, name in enumerate(names) if not _older(name)]
            batch = batch.select(kept)
            yield batch.rename_columns(_renamed(batch.schema.names))


def _older(name: str) -> bool:
    return name.startswith(PREVIOUS) and name[len(PREVIOUS):] in ANSWER_NAMES


def _renamed(names: list[str]) -> list[str]:
    return [PREVIOUS + name if name in ANSWER_NAMES and name != STAGE_ID_COLUMN else name
            for name in names if not _older(name)]

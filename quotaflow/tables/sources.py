"""Tables as batches of rows: CSV, Parquet and JSONL files, or rows a program holds.

Every source gives the same two views, read again from the start on each call: rows as
dicts (what a template renders) and Arrow record batches with one schema (what a table
out is written from). Nothing reads a table whole: Parquet by pyarrow's iter_batches,
CSV through the csv module, JSONL a line at a time, so memory holds about one batch of
BATCH_ROWS rows whatever the file's size. Rows are numbered from 1 (the first row after
a CSV header), as ingest numbers a file's lines, so the two name the same row.
"""

import csv
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from quotaflow.errors import RowError, TableError

BATCH_ROWS = 4096
# Parquet is read through a buffer of this size, a page at a time, on this thread:
# pyarrow's pre-buffering reads the column chunks of every row group ahead of the
# batches asked for (at a million rows, the whole file in memory at once).
READ_BUFFER_BYTES = 1 << 20
FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".jsonl": "jsonl",
           ".ndjson": "jsonl"}


def table_format(path: Path) -> str | None:
    """'parquet', 'csv' or 'jsonl' by the file's suffix; None for anything else."""
    return FORMATS.get(path.suffix.lower())


class RowSource:
    """A table to read in batches; subclasses give `_row_batches` or `_arrow_batches`."""

    name = "rows"

    def row_batches(self) -> Iterator[list[dict[str, Any]]]:
        """The rows as dicts, BATCH_ROWS at a time, in order."""
        for batch in self.arrow_batches():
            yield batch.to_pylist()

    def arrow_batches(self) -> Iterator[pa.RecordBatch]:
        """The rows as record batches sharing the schema of the first batch."""
        schema: pa.Schema | None = None
        for rows in self.row_batches():
            if schema is None:
                batch = _infer_batch(rows, self.name)
                schema = batch.schema
            else:
                batch = _typed_batch(rows, schema, self.name)
            yield batch

    def columns(self) -> list[str]:
        """The column names (from the first batch where the format has no header)."""
        for batch in self.arrow_batches():
            return list(batch.schema.names)
        return []


class ParquetSource(RowSource):
    def __init__(self, path: Path) -> None:
        self.path, self.name = path, path.name

    def _file(self) -> pq.ParquetFile:
        try:
            return pq.ParquetFile(self.path, pre_buffer=False, buffer_size=READ_BUFFER_BYTES)
        except (pa.ArrowException, OSError) as exc:
            raise TableError(f"cannot read {self.name} as Parquet: {exc}") from None

    def columns(self) -> list[str]:
        return list(self._file().schema_arrow.names)

    def arrow_batches(self) -> Iterator[pa.RecordBatch]:
        batches = self._file().iter_batches(batch_size=BATCH_ROWS, use_threads=False)
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except (pa.ArrowException, OSError) as exc:
                raise TableError(f"cannot read {self.name} as Parquet: {exc}") from None
            yield batch


class CsvSource(RowSource):
    """Every column is a string, as the file has it: a zip code keeps its leading zero."""

    def __init__(self, path: Path) -> None:
        self.path, self.name = path, path.name

    def columns(self) -> list[str]:
        with self.path.open(newline="", encoding="utf-8-sig") as handle:
            return self._header(csv.reader(handle))

    def _header(self, reader: Iterator[list[str]]) -> list[str]:
        try:
            header = next(reader, None)
        except (csv.Error, UnicodeDecodeError) as exc:
            raise TableError(f"cannot read {self.name} as CSV: {exc}") from None
        if not header:
            raise TableError(f"{self.name} is empty: a CSV table needs a header row")
        repeated = sorted({name for name in header if header.count(name) > 1})
        if repeated:
            raise TableError(f"{self.name}'s header names {', '.join(map(repr, repeated))} "
                             "more than once")
        return header

    def arrow_batches(self) -> Iterator[pa.RecordBatch]:
        with self.path.open(newline="", encoding="utf-8-sig") as handle:
            reader = csv.reader(handle)
            header = self._header(reader)
            schema = pa.schema([(name, pa.string()) for name in header])
            row_no = 0
            while True:
                try:  # blank lines are no rows, as csv.DictReader has it
                    rows = list(itertools.islice(filter(None, reader), BATCH_ROWS))
                except (csv.Error, UnicodeDecodeError) as exc:
                    raise TableError(f"cannot read {self.name} as CSV near row "
                                     f"{reader.line_num - 1}: {exc}") from None
                if not rows:
                    return
                for row in rows:
                    row_no += 1
                    if len(row) != len(header):
                        raise RowError(row_no, None, f"has {len(row)} fields where "
                                                     f"{self.name}'s header has {len(header)}")
                columns = zip(*rows, strict=True)
                yield pa.RecordBatch.from_arrays(
                    [pa.array(values, pa.string()) for values in columns], schema=schema)


class JsonlSource(RowSource):
    """One JSON object a line; its columns are the keys of the first batch of rows."""

    def __init__(self, path: Path) -> None:
        self.path, self.name = path, path.name

    def row_batches(self) -> Iterator[list[dict[str, Any]]]:
        with self.path.open("rb") as handle:
            row_no = 0
            rows: list[dict[str, Any]] = []
            for raw in handle:
                if not raw.strip():
                    continue
                row_no += 1
                try:
                    row = orjson.loads(raw)
                except orjson.JSONDecodeError as exc:
                    raise RowError(row_no, None, f"is not JSON ({exc})") from None
                if not isinstance(row, dict):
                    raise RowError(row_no, None, "is not a JSON object")
                rows.append(row)
                if len(rows) == BATCH_ROWS:
                    yield rows
                    rows = []
            if rows:
                yield rows


class MemoryRows(RowSource):
    """Rows a program holds: a sequence of mappings, or a pyarrow Table."""

    def __init__(self, rows: Sequence[Mapping[str, Any]] | pa.Table, name: str = "rows") -> None:
        self._rows, self.name = rows, name

    def arrow_batches(self) -> Iterator[pa.RecordBatch]:
        if isinstance(self._rows, pa.Table):
            yield from self._rows.to_batches(BATCH_ROWS)
            return
        yield from super().arrow_batches()

    def row_batches(self) -> Iterator[list[dict[str, Any]]]:
        if isinstance(self._rows, pa.Table):
            yield from super().row_batches()
            return
        for start in range(0, len(self._rows), BATCH_ROWS):
            yield [dict(row) for row in self._rows[start:start + BATCH_ROWS]]


def open_table(location: str | Path) -> RowSource:
    """The table at a path or an s3://, gs:// or az:// URL, by its suffix (.parquet,
    .pq, .csv, .jsonl, .ndjson)."""
    from quotaflow.tables.storage import is_url

    if is_url(location):
        from quotaflow.tables.remote import RemoteTable  # imports this module

        return RemoteTable(str(location))
    path = Path(location)
    kind = table_format(path)
    if kind is None:
        raise TableError(f"{path.name}: not a table quotaflow reads (give a .parquet, .csv "
                         "or .jsonl file)")
    if not path.is_file():
        raise TableError(f"{path}: no such file")
    return {"parquet": ParquetSource, "csv": CsvSource, "jsonl": JsonlSource}[kind](path)


class DatasetRows(RowSource):
    """A Hugging Face `datasets.Dataset` (its Arrow batches, in its order, through its
    indices where it was selected or shuffled) or `IterableDataset` (its rows as dicts,
    read again from the start on each call): never made into one table in memory."""

    def __init__(self, dataset: Any, name: str = "dataset") -> None:
        self._dataset, self.name = dataset, name
        self._iterable = not hasattr(dataset, "__len__")

    def arrow_batches(self) -> Iterator[pa.RecordBatch]:
        if self._iterable:
            yield from super().arrow_batches()
            return
        for table in self._dataset.with_format("arrow").iter(batch_size=BATCH_ROWS):
            yield from table.to_batches()

    def row_batches(self) -> Iterator[list[dict[str, Any]]]:
        if not self._iterable:
            yield from super().row_batches()
            return
        rows = iter(self._dataset)
        while batch := [dict(row) for row in itertools.islice(rows, BATCH_ROWS)]:
            yield batch


def rows_source(rows: Any) -> RowSource:
    """A program's rows: a list of dicts, a pyarrow Table, a pandas or polars DataFrame,
    or a Hugging Face Dataset or IterableDataset (none of these is a dependency: each is
    recognised by what it offers)."""
    if isinstance(rows, pa.Table):
        return MemoryRows(rows)
    if type(rows).__module__.startswith("datasets.") and hasattr(rows, "with_format"):
        return DatasetRows(rows)
    if hasattr(rows, "to_arrow"):  # a polars DataFrame
        return MemoryRows(rows.to_arrow())
    if type(rows).__module__.startswith("pandas"):
        return MemoryRows(pa.Table.from_pandas(rows, preserve_index=False))
    if isinstance(rows, Sequence) and all(isinstance(row, Mapping) for row in rows[:1]):
        return MemoryRows(rows)
    raise TableError("rows must be a list of dicts, a pyarrow Table, a DataFrame or a "
                     "datasets.Dataset, "
                     f"not {type(rows).__name__}")


def _infer_batch(rows: list[dict[str, Any]], name: str) -> pa.RecordBatch:
    """The first batch's columns: every key its rows have, in the order first seen."""
    names = list(dict.fromkeys(key for row in rows for key in row))
    arrays = []
    for column in names:
        try:
            arrays.append(pa.array([row.get(column) for row in rows]))
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise TableError(f"{name}: column {column!r} mixes values of different types "
                             f"({exc})") from None
    return pa.RecordBatch.from_arrays(arrays, names=names)


def _typed_batch(rows: Iterable[dict[str, Any]], schema: pa.Schema, name: str) -> pa.RecordBatch:
    try:
        return pa.RecordBatch.from_pylist(list(rows), schema=schema)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise TableError(f"{name}: a later row does not fit the columns of the first "
                         f"{BATCH_ROWS:,} rows ({exc})") from None

"""Tables out: record batches written to a Parquet or CSV file as they come.

The file is written beside its name (`out.parquet.part`) and moved into place only
once complete, so a download cut short or a join that finds the wrong input leaves no
file that looks whole. CSV has no nested types: a list or struct column is written as
its JSON text.
"""

import contextlib
import os
from pathlib import Path
from types import TracebackType

import orjson
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from quotaflow.errors import TableError

OUT_FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}


def out_format(path: Path) -> str | None:
    """'parquet' or 'csv' for a table out, by suffix; None for anything else (JSONL)."""
    return OUT_FORMATS.get(path.suffix.lower())


class TableSink:
    """A context manager: write(batch) for each batch, all with the first one's schema."""

    def __init__(self, path: Path) -> None:
        kind = out_format(path)
        if kind is None:
            raise TableError(f"{path.name}: a table out is a .parquet or .csv file")
        self.path, self.kind = path, kind
        self._part = path.with_name(path.name + ".part")
        self._writer: pq.ParquetWriter | pacsv.CSVWriter | None = None
        self.rows = 0

    def __enter__(self) -> "TableSink":
        return self

    def write(self, batch: pa.RecordBatch) -> None:
        if self.kind == "csv":
            batch = _flat(batch)
        if self._writer is None:
            try:
                self._writer = (pq.ParquetWriter(self._part, batch.schema)
                                if self.kind == "parquet"
                                else pacsv.CSVWriter(self._part, batch.schema))
            except OSError as exc:
                raise TableError(f"cannot write {self.path}: {exc}") from None
        self._writer.write_batch(batch)
        self.rows += batch.num_rows

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._writer is not None:
            self._writer.close()
        if kind is None and self._writer is not None:
            os.replace(self._part, self.path)
        else:
            with contextlib.suppress(FileNotFoundError):
                self._part.unlink()


def _flat(batch: pa.RecordBatch) -> pa.RecordBatch:
    """Nested columns as JSON text, which CSV can hold."""
    nested = [i for i, field in enumerate(batch.schema) if pa.types.is_nested(field.type)]
    if not nested:
        return batch
    arrays, fields = list(batch.columns), list(batch.schema)
    for i in nested:
        values = arrays[i].to_pylist()
        arrays[i] = pa.array([None if v is None else orjson.dumps(v, default=str).decode()
                              for v in values], pa.string())
        fields[i] = pa.field(fields[i].name, pa.string())
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))

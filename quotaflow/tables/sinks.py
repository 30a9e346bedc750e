"""Tables out: record batches written to a Parquet or CSV file as they come.

The file is written beside its name (`out.parquet.part`) and moved into place only
once complete, so a download cut short or a join that finds the wrong input leaves no
file that looks whole. An s3://, gs:// or az:// output is written straight to the
object as one multipart upload (quotaflow/tables/storage.py), a part as each block
fills: the object appears whole once the sink closes, or not at all. CSV has no
nested types: a list or struct column is written as its JSON text.
"""

import contextlib
import os
from pathlib import Path
from types import TracebackType
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from quotaflow.errors import TableError
from quotaflow.tables import storage

OUT_FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}


def out_format(path: str | Path) -> str | None:
    """'parquet' or 'csv' for a table out, by suffix; None for anything else (JSONL)."""
    return OUT_FORMATS.get(Path(storage.name_of(path)).suffix.lower())


class TableSink:
    """A context manager: write(batch) for each batch, all with the first one's schema."""

    def __init__(self, location: str | Path) -> None:
        kind = out_format(location)
        if kind is None:
            raise TableError(f"{storage.name_of(location)}: a table out is a .parquet or "
                             ".csv file")
        self._url: str | None = None
        if storage.is_url(location):
            storage.check_location(location)
            self._url = str(location)
        self.path, self.kind = Path(storage.name_of(location) if self._url else location), kind
        self._part = self.path.with_name(self.path.name + ".part")
        self._upload = contextlib.ExitStack()
        self._writer: pq.ParquetWriter | pacsv.CSVWriter | None = None
        self.rows = 0

    def __enter__(self) -> "TableSink":
        return self

    def write(self, batch: pa.RecordBatch) -> None:
        if self.kind == "csv":
            batch = _flat(batch)
        if self._writer is None:
            self._writer = self._open(batch.schema)
        self._writer.write_batch(batch)
        self.rows += batch.num_rows

    def _open(self, schema: pa.Schema) -> pq.ParquetWriter | pacsv.CSVWriter:
        where: Any = self._part
        if self._url is not None:  # the object, written as the batches come
            where = self._upload.enter_context(storage.object_writer(self._url))
        try:
            return (pq.ParquetWriter(where, schema) if self.kind == "parquet"
                    else pacsv.CSVWriter(where, schema))
        except OSError as exc:
            raise TableError(f"cannot write {self._url or self.path}: {exc}") from None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if self._writer is not None:
                self._writer.close()  # the footer, into the file or the object's last part
        except BaseException as failure:
            if kind is None:
                kind, exc, tb = type(failure), failure, failure.__traceback__
            self._finish(kind, exc, tb)
            raise
        self._finish(kind, exc, tb)

    def _finish(self, kind: type[BaseException] | None, exc: BaseException | None,
                tb: TracebackType | None) -> None:
        """The object completed, or discarded on a failure; a local file moved into place,
        or its part removed."""
        self._upload.__exit__(kind, exc, tb)
        if self._url is None and self._writer is not None:
            if kind is None:
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

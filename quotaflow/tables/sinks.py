"""Tables out: record batches written to a Parquet or CSV file as they come.

The file is written beside its name (`out.parquet.part`) and moved into place only
once complete, so a download cut short or a join that finds the wrong input leaves no
file that looks whole. An s3://, gs:// or az:// output is written so to a temporary
folder, then uploaded as one multipart upload (quotaflow/tables/storage.py): the object
appears whole or not at all. CSV has no nested types: a list or struct column is written as
its JSON text.
"""

import contextlib
import os
import tempfile
from pathlib import Path
from types import TracebackType

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
        self._folder: tempfile.TemporaryDirectory[str] | None = None
        if storage.is_url(location):
            storage.check_location(location)
            self._url = str(location)
            self._folder = tempfile.TemporaryDirectory(prefix="quotaflow-out-")
            path = Path(self._folder.name) / storage.name_of(location)
        else:
            path = Path(location)
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
        try:
            if kind is None and self._writer is not None:
                os.replace(self._part, self.path)
                if self._url is not None:
                    storage.upload(self.path, self._url)
            else:
                with contextlib.suppress(FileNotFoundError):
                    self._part.unlink()
        finally:
            if self._folder is not None:
                self._folder.cleanup()


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

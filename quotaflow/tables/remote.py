"""A table in object storage (s3://, gs://, az://), read through a streamed local copy.

The object is copied once, a block at a time, on first use and kept while the source
lives: a table is read twice (its rows made into requests, then its answers joined
back), and Parquet's reader seeks, so one copy read locally beats two passes of ranged
requests. Messages name the object's URL, not the copy.
"""

import shutil
import tempfile
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from quotaflow.errors import TableError
from quotaflow.tables import storage
from quotaflow.tables.sources import CsvSource, JsonlSource, ParquetSource, RowSource, table_format


class RemoteTable(RowSource):
    def __init__(self, url: str) -> None:
        storage.check_url(url)
        self.url = self.name = url
        self.kind = table_format(Path(storage.name_of(url)))
        if self.kind is None:
            raise TableError(f"{url}: not a table quotaflow reads (give a .parquet, .csv or "
                             ".jsonl object)")
        self._table: RowSource | None = None

    def _local(self) -> RowSource:
        if self._table is None:
            folder = Path(tempfile.mkdtemp(prefix="quotaflow-table-"))
            try:
                storage.download(self.url, folder / storage.name_of(self.url))
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            # the copy lives as long as this source: removed when it is collected
            weakref.finalize(self, shutil.rmtree, folder, ignore_errors=True)
            kinds = {"parquet": ParquetSource, "csv": CsvSource, "jsonl": JsonlSource}
            table = kinds[str(self.kind)](folder / storage.name_of(self.url))
            table.name = self.url
            self._table = table
        return self._table

    def columns(self) -> list[str]:
        return self._local().columns()

    def arrow_batches(self) -> Iterator[pa.RecordBatch]:
        return self._local().arrow_batches()

    def row_batches(self) -> Iterator[list[dict[str, Any]]]:
        return self._local().row_batches()

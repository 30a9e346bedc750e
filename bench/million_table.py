"""bench.million's table case: a million-row Parquet table in through a template, and
its rows with their answers out as Parquet (`quotaflow submit TABLE --template`,
`quotaflow results JOB -o out.parquet`)."""

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bench.ingest import WORDS

# Row groups as a writer of a large table makes them: the reader must not hold them all.
ROW_GROUP_ROWS = 100_000


def write_rows(path: Path, rows: int) -> int:
    """A Parquet table of `rows` rows (id, prompt: about 190 bytes, every one different)."""
    rng = random.Random(7)
    writer: pq.ParquetWriter | None = None
    for start in range(0, rows, ROW_GROUP_ROWS):
        numbers = range(start, min(rows, start + ROW_GROUP_ROWS))
        table = pa.table({"id": [f"request-{n:07d}" for n in numbers],
                          "prompt": [f"Request {n}: " + " ".join(rng.choices(WORDS, k=23))
                                     for n in numbers]})
        writer = writer or pq.ParquetWriter(path, table.schema)
        writer.write_table(table)
    assert writer is not None
    writer.close()
    return path.stat().st_size


def submit_args(source: Path, workdir: Path) -> list[str]:
    """`quotaflow submit`'s arguments for the table: each row's prompt, its id column."""
    template = workdir / "prompt.j2"
    template.write_text("{{ prompt }}")
    return [str(source), "--template", str(template), "--model", "gpt-4o-mini",
            "--system", "Answer briefly.", "--max-tokens", "256", "--id-column", "id"]


def check_rows(output: Path, rows: int) -> None:
    """Every input row once, in input order, with its columns and an answer."""
    count = 0
    for batch in pq.ParquetFile(output).iter_batches(columns=["id", "prompt",
                                                              "response_text", "error"]):
        ids = batch.column("id").to_pylist()
        expected = [f"request-{n:07d}" for n in range(count, count + batch.num_rows)]
        if ids != expected:
            raise AssertionError(f"rows {count + 1}-{count + batch.num_rows}: ids out of order")
        if batch.column("response_text").null_count or batch.column("error").null_count != \
                batch.num_rows:
            raise AssertionError(f"rows {count + 1}-{count + batch.num_rows}: an answer missing")
        count += batch.num_rows
    if count != rows:
        raise AssertionError(f"{count} rows out for {rows} rows in")

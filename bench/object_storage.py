"""Object storage against local files: a large JSONL file in, and its results out, from
and to a local folder and moto's S3 server (tests/harness/s3_server.py, on loopback).

    python -m bench.object_storage                  # 1,000,000 lines of about 415 bytes
    python -m bench.object_storage --lines 100000   # a quicker run

Each row times what the CLI does on its side of the API, through the same code:
`requests in`, what `quotaflow submit FILE` reads before and while it uploads (the
object's streamed copy, the line count of its progress, the read of the body in
64 KiB pieces); `table in`, what `submit TABLE --template` does (the JSONL rows made
into request lines through a template); `results out`, `quotaflow results -o`'s
writing of the result lines (about 400 bytes each); `table out`, `results -o
out.parquet`'s join of the rows and their answers, written a batch at a time. The
upload to the API and the job's run are bench.million's, the same for both.
"""

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from bench.ingest import machine, write_file
from quotaflow.tables import storage
from quotaflow.tables.join import joined_batches
from quotaflow.tables.requests import RequestShape, write_requests
from quotaflow.tables.sinks import TableSink
from quotaflow.tables.sources import open_table
from quotaflow.tables.templates import PromptTemplate
from quotaflow_client.uploads import count_lines
from tests.harness.s3_server import BUCKET, s3_env, s3_server


def _result(n: int) -> dict[str, Any]:
    return {"id": f"batch_req_{n}", "custom_id": str(n), "error": None, "response": {
        "status_code": 200, "request_id": f"req_{n}", "body": {
            "object": "chat.completion", "model": "gpt-4o-mini",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {
                "role": "assistant", "content": f"The answer to request {n} is a short "
                                                "paragraph a model wrote back."}}],
            "usage": {"prompt_tokens": 80, "completion_tokens": 40, "total_tokens": 120}}}}


def _results(lines: int) -> Iterator[dict[str, Any]]:
    return (_result(n) for n in range(1, lines + 1))


def requests_in(location: storage.Location) -> None:
    with storage.local_input(location) as path:
        count_lines(path)
        with path.open("rb") as body:
            while body.read(64 * 1024):
                pass


def table_in(location: storage.Location) -> None:
    template = PromptTemplate("{{ body.messages[1].content }}")
    with open(os.devnull, "wb") as out:
        write_requests(open_table(location), template, RequestShape(model="m"), out)


def results_out(location: storage.Location, lines: int) -> None:
    with storage.output_file(location) as out:
        for n in range(1, lines + 1, 10_000):
            out.write(b"".join(orjson.dumps(_result(i)) + b"\n"
                               for i in range(n, min(lines + 1, n + 10_000))))


def table_out(rows: storage.Location, location: storage.Location, lines: int) -> None:
    with TableSink(location) as sink:
        for batch in joined_batches(open_table(rows), None, _results(lines), iter(())):
            sink.write(batch)


def timed(run: Callable[[], None]) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    args = parser.parse_args()
    lines = args.lines
    with tempfile.TemporaryDirectory(prefix="qf-storage-bench-") as folder, \
            s3_server(own_process=True) as endpoint:
        os.environ.update(s3_env(endpoint))
        local = Path(folder) / "requests.jsonl"
        write_file(local, lines)
        remote = f"s3://{BUCKET}/requests.jsonl"
        storage.upload(local, remote)
        size_mb = local.stat().st_size / 1e6
        cases: list[tuple[str, Callable[[storage.Location], None]]] = [
            ("requests in", requests_in),
            ("table in", table_in),
            ("results out", lambda where: results_out(where, lines)),
            ("table out", lambda where: table_out(local, where, lines)),
        ]
        print(f"python -m bench.object_storage --lines {lines}  ({size_mb:,.0f} MB in; "
              f"{machine()})")
        print(f"{'path':<12} {'local s':>8} {'lines/s':>9} {'s3 s':>7} {'lines/s':>9} "
              f"{'s3/local':>9}")
        for name, case in cases:
            out_name = "answers.parquet" if name == "table out" else "out.jsonl"
            local_at: storage.Location = local if name.endswith(" in") else (
                Path(folder) / out_name)
            s3_at = remote if name.endswith(" in") else f"s3://{BUCKET}/{out_name}"
            local_s = timed(lambda: case(local_at))  # noqa: B023  (called at once)
            s3_s = timed(lambda: case(s3_at))  # noqa: B023
            print(f"{name:<12} {local_s:>8.2f} {lines / local_s:>9,.0f} {s3_s:>7.2f} "
                  f"{lines / s3_s:>9,.0f} {local_s / s3_s:>8.0%}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

"""A million-line job end to end: `quotaflow submit`, the run on the instant provider,
`quotaflow results -o`, with the API's and the CLI's peak memory.

    python -m bench.million                    # 1,000,000 lines (a few minutes)
    python -m bench.million --lines 50000      # CI-sized
    python -m bench.million --table            # a Parquet table in and out instead
    python -m bench.million --s3               # from and to an S3 server (moto) instead

It starts what bench.e2e starts (a throwaway PostgreSQL and redis-server, the mock
provider made unlimited and instant, `quotaflow api`, W `quotaflow worker
--concurrency 2`) from this checkout and stops it, by pid, at the end. The file is
bench.ingest's (about 415 bytes a line, every prompt different). Timed: submit, from
the CLI's start to the printed job id (upload, parse, validate, COPY, commit,
dispatch); run, from the job id to `completed` in PostgreSQL; download, the CLI's
`results -o` from start to exit. The results file is then checked: one line per
input line, each custom_id once, in input order. Peak RSS: the API's VmHWM (/proc)
and each CLI process's, read as it runs. With --table the input is a Parquet table
of as many rows (bench/million_table.py), sent through a template, and the download is
`results -o out.parquet`, its rows joined to their answers, checked the same way. With
--s3 the input is first put in a local S3 server (moto, in a process of its own) and the
CLI submits its s3:// URL and writes its results to another; the result object is
fetched back, untimed, to be checked.
"""

import argparse
import concurrent.futures
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import psycopg

from bench.e2e import Bench, _process_table, machine, quotaflow, tree_cpu, wait_with_rusage
from bench.ingest import peak_rss_mb, write_file
from bench.million_table import check_rows, submit_args, write_rows
from quotaflow.tables import storage
from tests.harness.s3_server import BUCKET, s3_env, s3_server

POLL_S = 0.2


def run(args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    args.sizes, args.batch_size, args.pg_statements = [args.lines], None, 0
    bench = Bench(args, workdir)
    objects: dict[str, str] = {}
    try:
        bench.start_provider()
        bench.start_cluster()
        print(machine(bench.versions), flush=True)
        source = workdir / ("rows.parquet" if args.table else "batch.jsonl")
        size = (write_rows if args.table else write_file)(source, args.lines)
        given = submit_args(source, workdir) if args.table else [str(source)]
        if args.s3:  # the same file, as an object: the CLI reads it from there
            objects["in"] = f"s3://{BUCKET}/{source.name}"
            storage.upload(source, objects["in"])
            given[0] = objects["in"]
        print(f"input: {args.lines:,} {'rows' if args.table else 'lines'}, {size / 1e6:,.0f} "
              f"MB; {args.workers} workers x 2", flush=True)
        env = bench.cluster_env() | {"QUOTAFLOW_API_URL": bench.api_url} | objects_env()
        workers = [bench._start(f"worker{n}", quotaflow(
            "worker", "--concurrency", "2", "--name", f"million{n}@bench"), env)
            for n in range(1, args.workers + 1)]
        for worker in workers:
            worker.wait_until(lambda w=worker: " ready." in w.log())
        api_idle = peak_rss_mb(bench.api.pid)

        api_cpu = tree_cpu([bench.api.pid], _process_table())
        pg_cpu = tree_cpu([bench.postgres.pid], _process_table())
        started = time.monotonic()
        submit = bench._start("submit", quotaflow("submit", *given, "--queue", "bulk"), env)
        submit_use, submit_rss = wait_with_peak(submit, args.timeout, "submit")
        submitted = time.monotonic()
        job_id = submit.log().strip().splitlines()[-1]
        if submit.popen.returncode != 0:
            raise RuntimeError(f"submit failed:\n{submit.log()}")
        api_submit = peak_rss_mb(bench.api.pid)
        table = _process_table()
        submit_cpu = (f"API {tree_cpu([bench.api.pid], table) - api_cpu:.1f}, "
                      f"PostgreSQL {tree_cpu([bench.postgres.pid], table) - pg_cpu:.1f}, "
                      f"CLI {submit_use.ru_utime + submit_use.ru_stime:.1f}")
        with psycopg.connect(bench.db_url.replace("postgresql+psycopg://", "postgresql://"),
                             autocommit=True) as conn:
            while (status := conn.execute("SELECT status FROM jobs WHERE id = %s",
                                          (job_id,)).fetchone()[0]) in ("validating",
                                                                        "in_progress"):
                if time.monotonic() - submitted > args.timeout:
                    raise TimeoutError(f"job {job_id} not done after {args.timeout:.0f} s")
                time.sleep(POLL_S)
        ran = time.monotonic()
        if status != "completed":
            raise RuntimeError(f"job {job_id} ended {status}")
        for worker in workers:
            bench._stop(worker)

        output = workdir / ("results.parquet" if args.table else "results.jsonl")
        written_to = f"s3://{BUCKET}/{output.name}" if args.s3 else str(output)
        api_cpu = tree_cpu([bench.api.pid], _process_table())
        pg_cpu = tree_cpu([bench.postgres.pid], _process_table())
        download_started = time.monotonic()  # the workers' shutdown above is not the download's
        download = bench._start("results", quotaflow("results", job_id, "-o", written_to), env)
        download_use, results_rss = wait_with_peak(download, args.timeout, "results")
        downloaded = time.monotonic()
        api_cpu = tree_cpu([bench.api.pid], _process_table()) - api_cpu
        pg_cpu = tree_cpu([bench.postgres.pid], _process_table()) - pg_cpu
        if download.popen.returncode != 0:
            raise RuntimeError(f"results failed:\n{download.log()}")
        if args.s3:
            storage.download(written_to, output)
        (check_rows if args.table else check_output)(output, args.lines)
        return {"lines": args.lines, "submit_s": submitted - started,
                "run_s": ran - submitted, "download_s": downloaded - download_started,
                "api_idle": api_idle, "api_submit": api_submit,
                "api_peak": peak_rss_mb(bench.api.pid),
                "submit_rss": submit_rss, "results_rss": results_rss,
                "download_mb": output.stat().st_size / 1e6,
                "submit_cpu": submit_cpu,
                "download_cpu": (f"API {api_cpu:.1f}, PostgreSQL {pg_cpu:.1f}, CLI "
                                 f"{download_use.ru_utime + download_use.ru_stime:.1f}")}
    finally:
        bench.close()


def objects_env() -> dict[str, str]:
    """The S3 server's endpoint and keys, when this run has one (main set them)."""
    return {name: os.environ[name] for name in s3_env("") if name in os.environ}


def wait_with_peak(proc: Any, timeout: float, label: str) -> tuple[Any, float]:
    """wait_with_rusage, with the process's own peak RSS (VmHWM, read as it runs until
    it exits): ru_maxrss of a child counts the bench's own memory at the fork."""
    peak = 0.0
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waited = pool.submit(wait_with_rusage, proc, timeout, label)
        while not waited.done():
            with contextlib.suppress(OSError, ValueError):
                peak = max(peak, peak_rss_mb(proc.pid))
            time.sleep(POLL_S / 4)
        return waited.result(), peak


def check_output(output: Path, lines: int) -> None:
    """Every line once, in input order, each a success: what "exactly once" means here."""
    count = 0
    with output.open("rb") as handle:
        for count, line in enumerate(handle, 1):
            record = orjson.loads(line)
            expected = f"request-{count - 1:07d}"
            if record["custom_id"] != expected or record["response"]["status_code"] != 200:
                raise AssertionError(f"line {count}: {record['custom_id']} "
                                     f"(expected {expected}), {record['response']['status_code']}")
    if count != lines:
        raise AssertionError(f"{count} result lines for {lines} input lines")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--table", action="store_true",
                        help="A Parquet table in through a template and out with its "
                             "answers, instead of a JSONL file of requests.")
    parser.add_argument("--s3", action="store_true",
                        help="Read the input from, and write the results to, a local S3 "
                             "server (moto) instead of local files.")
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="Seconds each phase may take before the run is aborted.")
    args = parser.parse_args()
    args.pg_option, args.metrics = [], False
    with tempfile.TemporaryDirectory(prefix="qf-million-") as workdir, \
            contextlib.ExitStack() as objects:
        if args.s3:
            os.environ.update(s3_env(objects.enter_context(s3_server(own_process=True))))
        row = run(args, Path(workdir))
    n = row["lines"]
    print(f"API RSS idle {row['api_idle']:.0f} MB, after submit {row['api_submit']:.0f} MB; "
          f"results file {row['download_mb']:,.0f} MB")
    print(f"CPU s: submit {row['submit_cpu']}; download {row['download_cpu']}")
    print(f"from and to {'S3 (moto)' if args.s3 else 'local files'}")
    header = ("rows" if args.table else "lines", "submit s", "lines/s", "run s", "req/s",
              "download s", "lines/s", "API peak MB", "submit CLI MB", "results CLI MB")
    values = (f"{n:,}", f"{row['submit_s']:.1f}", f"{n / row['submit_s']:,.0f}",
              f"{row['run_s']:.1f}", f"{n / row['run_s']:,.0f}", f"{row['download_s']:.1f}",
              f"{n / row['download_s']:,.0f}", f"{row['api_peak']:.0f}",
              f"{row['submit_rss']:.0f}", f"{row['results_rss']:.0f}")
    widths = [max(len(h), len(v)) for h, v in zip(header, values, strict=True)]
    print("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    print("  ".join(v.rjust(w) for v, w in zip(values, widths, strict=True)))


if __name__ == "__main__":
    sys.exit(main())

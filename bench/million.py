"""A million-line job end to end: `quotaflow submit`, the run on the instant provider,
`quotaflow results -o`, with the API's and the CLI's peak memory.

    python -m bench.million                    # 1,000,000 lines (a few minutes)
    python -m bench.million --lines 50000      # CI-sized

It starts what bench.e2e starts (a throwaway PostgreSQL and redis-server, the mock
provider made unlimited and instant, `quotaflow api`, W `quotaflow worker
--concurrency 2`) from this checkout and stops it, by pid, at the end. The file is
bench.ingest's (about 415 bytes a line, every prompt different). Timed: submit, from
the CLI's start to the printed job id (upload, parse, validate, COPY, commit,
dispatch); run, from the job id to `completed` in PostgreSQL; download, the CLI's
`results -o` from start to exit. The results file is then checked: one line per
input line, each custom_id once, in input order. Peak RSS: the API's VmHWM (/proc)
and each CLI process's ru_maxrss (os.wait4).
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

import orjson
import psycopg

from bench.e2e import Bench, _process_table, machine, quotaflow, tree_cpu, wait_with_rusage
from bench.ingest import peak_rss_mb, write_file

POLL_S = 0.2


def run(args: argparse.Namespace, workdir: Path) -> dict[str, float]:
    args.sizes, args.batch_size, args.pg_statements = [args.lines], None, 0
    bench = Bench(args, workdir)
    try:
        bench.start_provider()
        bench.start_cluster()
        print(machine(bench.versions), flush=True)
        source = workdir / "batch.jsonl"
        size = write_file(source, args.lines)
        print(f"input: {args.lines:,} lines, {size / 1e6:,.0f} MB; {args.workers} workers x 2",
              flush=True)
        env = bench.cluster_env() | {"QUOTAFLOW_API_URL": bench.api_url}
        workers = [bench._start(f"worker{n}", quotaflow(
            "worker", "--concurrency", "2", "--name", f"million{n}@bench"), env)
            for n in range(1, args.workers + 1)]
        for worker in workers:
            worker.wait_until(lambda w=worker: " ready." in w.log())
        api_idle = peak_rss_mb(bench.api.pid)

        api_cpu = tree_cpu([bench.api.pid], _process_table())
        pg_cpu = tree_cpu([bench.postgres.pid], _process_table())
        started = time.monotonic()
        submit = bench._start("submit", quotaflow("submit", str(source), "--queue", "bulk"), env)
        submit_use = wait_with_rusage(submit, args.timeout, "submit")
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

        output = workdir / "results.jsonl"
        api_cpu = tree_cpu([bench.api.pid], _process_table())
        pg_cpu = tree_cpu([bench.postgres.pid], _process_table())
        download_started = time.monotonic()  # the workers' shutdown above is not the download's
        download = bench._start("results", quotaflow("results", job_id, "-o", str(output)), env)
        download_use = wait_with_rusage(download, args.timeout, "results")
        downloaded = time.monotonic()
        api_cpu = tree_cpu([bench.api.pid], _process_table()) - api_cpu
        pg_cpu = tree_cpu([bench.postgres.pid], _process_table()) - pg_cpu
        if download.popen.returncode != 0:
            raise RuntimeError(f"results failed:\n{download.log()}")
        check_output(output, args.lines)
        return {"lines": args.lines, "submit_s": submitted - started,
                "run_s": ran - submitted, "download_s": downloaded - download_started,
                "api_idle": api_idle, "api_submit": api_submit,
                "api_peak": peak_rss_mb(bench.api.pid),
                "submit_rss": submit_use.ru_maxrss / 1024,
                "results_rss": download_use.ru_maxrss / 1024,
                "download_mb": output.stat().st_size / 1e6,
                "submit_cpu": submit_cpu,
                "download_cpu": (f"API {api_cpu:.1f}, PostgreSQL {pg_cpu:.1f}, CLI "
                                 f"{download_use.ru_utime + download_use.ru_stime:.1f}")}
    finally:
        bench.close()


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
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="Seconds each phase may take before the run is aborted.")
    args = parser.parse_args()
    args.pg_option, args.metrics = [], False
    with tempfile.TemporaryDirectory(prefix="qf-million-") as workdir:
        row = run(args, Path(workdir))
    n = row["lines"]
    print(f"API RSS idle {row['api_idle']:.0f} MB, after submit {row['api_submit']:.0f} MB; "
          f"results file {row['download_mb']:,.0f} MB")
    print(f"CPU s: submit {row['submit_cpu']}; download {row['download_cpu']}")
    header = ("lines", "submit s", "lines/s", "run s", "req/s", "download s", "lines/s",
              "API peak MB", "submit CLI MB", "results CLI MB")
    values = (f"{n:,}", f"{row['submit_s']:.1f}", f"{n / row['submit_s']:,.0f}",
              f"{row['run_s']:.1f}", f"{n / row['run_s']:,.0f}", f"{row['download_s']:.1f}",
              f"{n / row['download_s']:,.0f}", f"{row['api_peak']:.0f}",
              f"{row['submit_rss']:.0f}", f"{row['results_rss']:.0f}")
    widths = [max(len(h), len(v)) for h, v in zip(header, values, strict=True)]
    print("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    print("  ".join(v.rjust(w) for v, w in zip(values, widths, strict=True)))


if __name__ == "__main__":
    sys.exit(main())

"""The API under a crowd while a large job runs (issue 45): status reads and small
realtime jobs at rising client counts, with the job's own rate beside each; prints
markdown tables.

    python -m bench.api_load                                  # the issue's sizes
    python -m bench.api_load --lines 20000 --pollers 1,10,100 --submitters 10,50 --seconds 5

It starts (tests/harness/api_load.py) an unlimited mock provider answering in
--provider-ms, `quotaflow api` (--api-workers processes, passed on as `--workers` where
the API has that option) and --workers plain `quotaflow worker`s, on the database
quotaflow_bench (dropped and made again) and Redis db 14, or
QUOTAFLOW_BENCH_DATABASE_URL / QUOTAFLOW_BENCH_REDIS_URL; it stops them by pid at the end.
Requests carry one API key (QUOTAFLOW_AUTH on; --no-auth turns it off); the per-key
request limit is turned off (QUOTAFLOW_API_RATE_LIMIT=off, where the API has it).

A job of --lines lines is streamed to POST /jobs/jsonl (bulk queue); while it runs:

- quiet: no clients; the job's rate alone (requests answered per second, counted in
  PostgreSQL past the API), the baseline the other rows compare with;
- pollers N: N clients each read GET /jobs/{id} and GET /v1/batches/{id} in turn, back
  to back, for --seconds: reads/s (answers that ended within the window), latency
  percentiles, errors by kind (HTTP status, timeout at --client-timeout, connection);
- submitters N: N clients each POST a --small-lines realtime job (`POST
  /jobs/jsonl?queue=realtime`) and wait for it to complete (a long-poll,
  `GET /jobs/{id}?wait=`, where the API's schema has one; else a read every 100 ms),
  again, for --seconds: jobs created/s, creation and submit-to-completed percentiles.

The clients are tests/harness/api_clients.py: one asyncio process (or --client-procs
forked ones), each client one keep-alive connection. "client CPU" is the load
generator's CPU over the phase's wall time: near 100% per process means the
generator, not the API, set the pace, and more --client-procs are needed.
"""

import argparse
import os
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from quotaflow.db import upgrade
from tests.harness.api_clients import Crowd, SubmitTally, Tally, run_crowd
from tests.harness.api_load import (
    RUNNING,
    LoadCluster,
    api_has_long_poll,
    api_has_workers_option,
    key_limit_off_env,
    small_job,
)
from tests.harness.servers import recreate_database

REDIS_URL = os.environ.get("QUOTAFLOW_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
PG_URL = os.environ.get("QUOTAFLOW_BENCH_DATABASE_URL",
                        "postgresql+psycopg://postgres@127.0.0.1:5432/quotaflow_bench")


@dataclass
class Phase:
    """One row: what the crowd saw, and the large job's rate meanwhile."""

    name: str
    clients: int
    seconds: float
    job_rate: float
    job_ended: bool
    tally: Tally | SubmitTally | None = None
    skipped: str = ""  # why no crowd ran
    ended_before: bool = False  # the job had ended before the phase: no rate to show


def _ms(seconds: float) -> str:
    return "-" if seconds != seconds else f"{seconds * 1000:,.0f}"


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def _job_cell(phase: Phase, quiet: float) -> str:
    if phase.ended_before:
        return "- (job ended)"
    change = f" ({(phase.job_rate / quiet - 1) * 100:+.0f}%)" if quiet > 0 else ""
    return f"{phase.job_rate:,.0f}{change}" + (" (job ended)" if phase.job_ended else "")


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


class Run:
    """The cluster, the large job and the phases run against it."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.cluster = LoadCluster(workdir, PG_URL, REDIS_URL, provider_ms=args.provider_ms,
                                   api_workers=args.api_workers, workers=args.workers,
                                   auth=not args.no_auth)
        self.job_id = ""
        self.long_poll = False

    def start(self) -> float:
        """Start everything and the large job; the seconds its upload took."""
        if self.args.api_workers > 1 and not api_has_workers_option():
            raise SystemExit("--api-workers > 1: `quotaflow api` has no --workers here")
        self.cluster.start()
        self.long_poll = api_has_long_poll(self.cluster.api_url)
        started = time.monotonic()
        self.job_id = self.cluster.submit_big(self.args.lines)
        upload_s = time.monotonic() - started
        deadline = time.monotonic() + 60
        while not self.cluster.answered(self.job_id):  # the workers have begun
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer for {self.job_id} within 60 s of its upload")
            time.sleep(0.2)
        return upload_s

    def phase(self, name: str, clients: int, kind: str | None) -> Phase:
        """Run one crowd (or none, for `quiet`) and measure the job's rate meanwhile."""
        waited = self.cluster.recover(self.job_id, self.args.recover_s)
        if waited is None and kind is not None:
            why = f"skipped: the API answered no read for {self.args.recover_s:g} s"
            print(f"  {name} {clients}: {why}", flush=True)
            return Phase(name, clients, 0.0, 0.0, False, skipped=why)
        if waited is not None and waited > 1:
            print(f"  (the API answered again {waited:.0f} s after the last phase)", flush=True)
        ended_before = self.cluster.status(self.job_id) not in RUNNING
        before, started = self.cluster.answered(self.job_id), time.monotonic()
        tally: Tally | SubmitTally | None = None
        if kind is None:
            time.sleep(self.args.seconds)
        else:
            crowd = Crowd(self.cluster.api_url, self.cluster.headers, self.args.seconds,
                          max_requests=self.args.max_requests, timeout_s=self.args.client_timeout,
                          job_id=self.job_id, body=small_job(self.args.small_lines),
                          lines=self.args.small_lines, long_poll=self.long_poll)
            tally = run_crowd(kind, crowd, clients, self.args.client_procs)
        seconds = time.monotonic() - started
        ended = self.cluster.status(self.job_id) not in RUNNING
        rate = (self.cluster.answered(self.job_id) - before) / seconds
        phase = Phase(name, clients, seconds, rate, ended, tally, ended_before=ended_before)
        print(f"  {name} {clients}: {seconds:.1f} s, job {rate:,.0f} req/s"
              + (f", errors {self._tally(phase).error_text()}" if tally else ""), flush=True)
        return phase

    def calibrate(self) -> None:
        """The load generator's own ceiling: the largest poller crowd reads the mock
        provider's /healthz (no database, a raw ASGI app) for one phase."""
        clients = max(self.args.pollers)
        crowd = Crowd(self.cluster.provider_url, {}, self.args.seconds,
                      max_requests=self.args.max_requests, timeout_s=self.args.client_timeout,
                      paths=("/healthz",))
        started = time.monotonic()
        tally = run_crowd("poll", crowd, clients, self.args.client_procs)
        assert isinstance(tally, Tally)
        seconds = time.monotonic() - started
        print(f"calibration: {clients:,} clients in {self.args.client_procs} process(es) read "
              f"the provider's /healthz at {tally.in_window / self.args.seconds:,.0f}/s, p99 "
              f"{_ms(tally.percentile(0.99))} ms, errors {tally.error_text()}, client CPU "
              f"{tally.cpu_s / seconds * 100:.0f}%", flush=True)

    @staticmethod
    def _tally(phase: Phase) -> Tally:
        return phase.tally.create if isinstance(phase.tally, SubmitTally) else phase.tally

    def reads_table(self, phases: list[Phase], quiet: float) -> str:
        rows = []
        for phase in phases:
            tally = phase.tally
            if phase.skipped:
                rows.append(["pollers", f"{phase.clients:,}", *["-"] * 5, phase.skipped, "-",
                             "-"])
                continue
            if not isinstance(tally, Tally):
                rows.append(["quiet", "0", "-", "-", "-", "-", "-", "-",
                             _job_cell(phase, quiet), "-"])
                continue
            rows.append([
                "pollers", f"{phase.clients:,}", f"{tally.in_window / self.args.seconds:,.0f}",
                *(_ms(tally.percentile(q)) for q in (0.5, 0.95, 0.99)),
                _ms(max(tally.latencies, default=float("nan"))), tally.error_text(),
                _job_cell(phase, quiet), f"{tally.cpu_s / phase.seconds * 100:.0f}%"])
        return _table(["phase", "clients", "reads/s", "p50 ms", "p95 ms", "p99 ms", "max ms",
                       "errors", "job req/s (vs quiet)", "client CPU"], rows)

    def submits_table(self, phases: list[Phase], quiet: float) -> str:
        rows = []
        for phase in phases:
            made = phase.tally
            if phase.skipped:
                rows.append([f"{phase.clients:,}", *["-"] * 7, phase.skipped, "-", "-"])
                continue
            assert isinstance(made, SubmitTally)
            unfinished = sum(counts is None for counts in made.jobs.values())
            rows.append([
                f"{phase.clients:,}", f"{made.create.in_window / self.args.seconds:,.1f}",
                _ms(made.create.percentile(0.5)), _ms(made.create.percentile(0.95)),
                _ms(made.done_percentile(0.5)), _ms(made.done_percentile(0.95)),
                f"{self.args.provider_ms:g}", f"{len(made.done):,} / {len(made.jobs):,}"
                + (f" ({unfinished} not final)" if unfinished else ""),
                made.create.error_text(), _job_cell(phase, quiet),
                f"{made.create.cpu_s / phase.seconds * 100:.0f}%"])
        return _table(["submitters", "jobs/s created", "create p50 ms", "create p95 ms",
                       "to completed p50 ms", "p95 ms", "provider ms", "completed / made",
                       "errors", "job req/s (vs quiet)", "client CPU"], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000, help="The large job's lines.")
    parser.add_argument("--pollers", type=_ints, default=[1, 10, 100, 1000])
    parser.add_argument("--submitters", type=_ints, default=[10, 100, 200])
    parser.add_argument("--seconds", type=float, default=10.0, help="Each phase's length.")
    parser.add_argument("--provider-ms", type=float, default=20.0)
    parser.add_argument("--small-lines", type=int, default=5)
    parser.add_argument("--api-workers", type=int, default=1,
                        help="API processes (`quotaflow api --workers N`, where it exists).")
    parser.add_argument("--workers", type=int, default=2, help="`quotaflow worker`s.")
    parser.add_argument("--client-procs", type=int, default=1,
                        help="Processes the clients are spread over.")
    parser.add_argument("--client-timeout", type=float, default=10.0)
    parser.add_argument("--max-requests", type=int, default=100_000,
                        help="Requests (or jobs) per client at most, beside --seconds.")
    parser.add_argument("--recover-s", type=float, default=120.0,
                        help="How long a phase waits for the API to answer a read again "
                             "after the last one before it is skipped.")
    parser.add_argument("--no-auth", action="store_true", help="QUOTAFLOW_AUTH=off.")
    parser.add_argument("--calibrate", action="store_true",
                        help="First measure the clients' own ceiling (see Run.calibrate).")
    args = parser.parse_args()

    recreate_database(PG_URL)
    upgrade(PG_URL)
    redis.Redis.from_url(REDIS_URL).flushdb()
    run = Run(args, Path(tempfile.mkdtemp(prefix="qf-api-load-")))
    try:
        upload_s = run.start()
        limits_off = ", ".join(key_limit_off_env())
        limits_off = f" ({limits_off} set off)" if limits_off else ""
        print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
              f"large job {args.lines:,} lines (upload {upload_s:.1f} s); provider "
              f"{args.provider_ms:g} ms, unlimited; {args.api_workers} API process(es), "
              f"{args.workers} workers x 2; auth {'off' if args.no_auth else 'one key'}"
              f"{limits_off}"
              f"; {args.seconds:g} s a phase; client timeout {args.client_timeout:g} s, "
              f"{args.client_procs} client process(es); submitters wait by "
              f"{'long-poll' if run.long_poll else 'polling every 100 ms'}", flush=True)
        if args.calibrate:
            run.calibrate()
        quiet = run.phase("quiet", 0, None)
        reads = [run.phase("pollers", n, "poll") for n in args.pollers]
        submits = [run.phase("submitters", n, "submit") for n in args.submitters]
        after = run.phase("quiet", 0, None)
    finally:
        run.cluster.stop()
        redis.Redis.from_url(REDIS_URL).flushdb()
    baseline = statistics.mean(p.job_rate for p in (quiet, after) if not p.job_ended) \
        if not (quiet.job_ended and after.job_ended) else 0.0
    print(f"\nStatus reads (the job's rate quiet: {baseline:,.0f} req/s)\n")
    print(run.reads_table([quiet, *reads, after], baseline))
    print(f"\nSmall realtime jobs of {args.small_lines} lines\n")
    print(run.submits_table(submits, baseline))


if __name__ == "__main__":
    main()

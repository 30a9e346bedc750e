"""Realtime under a bulk flood: the cluster, the flood and the measurement that
tests/cluster/test_realtime_flood.py asserts on and bench/realtime_flood.py prints.

A strict mock provider admits 20 requests a second (1,200 RPM enforced over 10 s),
200 ms a call. Bulk jobs far larger than that budget are queued first and left to
saturate it and every bulk worker slot; then a 10-line realtime job is submitted and
each of its lines' latency is measured from the job's creation to its answer's
(results.answered_at). Two worker layouts:

- "split" (compose.yml, docs/concepts/queues.md): one worker consumes
  only `realtime`, the others `standard,bulk`. A realtime message never waits behind a
  bulk batch for a pool slot or in a queue, and the bulk queue's priority floor (20%
  of the bucket) leaves budget for it.
- "shared": every worker consumes every queue with no slot kept for realtime
  (`--realtime-slots 0`, `quotaflow worker`'s default before issue 30). A realtime
  message waits for a slot, and bulk batches hold theirs for as long as the budget
  takes to send their 100 lines.
- "default": three plain `quotaflow worker`s (every queue, and a thread of each kept
  for realtime alone: cli/worker_group.py).
"""

import statistics
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx
from celery import Celery
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.db import session_factory
from quotaflow.models import Job, Result
from tests.harness.cluster import deployment_file, start_provider
from tests.harness.factories import chat_line, jsonl
from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import service_env

RPM = 1200
BURST_S = 10
LATENCY_MS = 200
REALTIME_LINES = 10
BULK_WINDOW_S = 10.0
LAYOUTS = {"split": ("realtime", "standard,bulk", "standard,bulk"),
           "shared": ("realtime,standard,bulk",) * 3,
           "default": ("realtime,standard,bulk",) * 3}
# What each layout's workers are started with beside --queues (None: no --queues, the
# plain command) and the Celery workers each one is (the default's realtime companion).
WORKER_ARGS: dict[str, tuple[str, ...] | None] = {
    "split": (), "shared": ("--realtime-slots", "0"), "default": None}


@dataclass
class FloodResult:
    layout: str
    latencies: list[float]
    bulk_done_before: int  # bulk answers stored when the realtime job was submitted
    bulk_rate: float  # bulk answers per second from the realtime job's submission, over
    # at least BULK_WINDOW_S (its own life is too short a window to compare layouts by)
    slot_batches: int | None = None  # batches the realtime slots ran meanwhile ("default")

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    @property
    def p50(self) -> float:
        return statistics.median(self.latencies)

    @property
    def p95(self) -> float:
        return self.percentile(0.95)


@dataclass
class FloodCluster:
    """A provider, the API and three workers in the given layout, on the caller's
    PostgreSQL and a Redis db of its own (flushed by the caller)."""

    tmp_path: Path
    pg_url: str
    redis_url: str
    layout: str
    procs: list[Proc] = field(default_factory=list)
    api_url: str = ""

    def start(self) -> None:
        provider, provider_url = start_provider(
            self.tmp_path, "--rpm", str(RPM), "--tpm", "100000000",
            "--burst-seconds", str(BURST_S), "--latency-ms", str(LATENCY_MS))
        self.procs.append(provider)
        deployments = deployment_file(self.tmp_path, "strict", provider_url, rpm=RPM,
                                      burst_seconds=BURST_S)
        env = service_env(QUOTAFLOW_DATABASE_URL=self.pg_url, QUOTAFLOW_BROKER_URL=self.redis_url,
                          QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments), QUOTAFLOW_AUTH="false")
        port = free_port()
        api = Proc("api", quotaflow("api", "--port", str(port)), env, self.tmp_path)
        self.procs.append(api)
        self.api_url = f"http://127.0.0.1:{port}"
        api.wait_http(f"{self.api_url}/healthz")
        extra = WORKER_ARGS[self.layout]
        workers = [Proc(f"worker{n}", quotaflow(
            "worker", *(("--queues", queues, *extra) if extra is not None else ()),
            "--concurrency", "2", "--name", f"flood{n}@qftest"), env, self.tmp_path)
                   for n, queues in enumerate(LAYOUTS[self.layout])]
        self.procs += workers
        for n, worker in enumerate(workers):
            worker.wait_until(lambda w=worker, n=n: f"flood{n}@qftest ready." in w.log(200_000))
            if self.layout == "default":  # and its realtime slot, where it has one
                deadline = time.monotonic() + 30
                while (f"flood{n}-realtime@qftest ready." not in worker.log(200_000)
                       and time.monotonic() < deadline):
                    time.sleep(0.2)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()

    def submit(self, queue: str, lines: int, prefix: str) -> str:
        data = jsonl([chat_line(f"{prefix}{i}", prompt=f"{prefix} question {i}")
                      for i in range(lines)])
        answer = httpx.post(f"{self.api_url}/jobs", files={"file": (f"{prefix}.jsonl", data)},
                            data={"queue": queue}, timeout=60)
        assert answer.status_code == 201, answer.text
        return answer.json()["id"]

    def cancel(self, job_id: str) -> None:
        httpx.post(f"{self.api_url}/jobs/{job_id}/cancel", timeout=30)

    def run(self, flood_s: float = 8.0, bulk_lines: int = 2000,
            timeout: float = 90.0) -> FloodResult:
        """Flood, then time a realtime job through it; the bulk jobs are cancelled after."""
        sessions = session_factory(self.pg_url)
        # Warm: a worker's first batch loads its executor and opens its connections, which
        # is not what a realtime job meets in a cluster that has been running.
        self._wait_answered(sessions, self.submit("realtime", 2, "warm-"), 2, timeout)
        bulk = [self.submit("bulk", bulk_lines, f"b{n}-") for n in range(2)]
        time.sleep(flood_s)  # every bulk slot busy, the budget spent down to its floor
        before = _answers(sessions, bulk)
        slots_before = self.slot_batches()
        started = time.monotonic()
        realtime = self.submit("realtime", REALTIME_LINES, "rt-")
        created, answered = self._wait_answered(sessions, realtime, REALTIME_LINES, timeout)
        slots_after = self.slot_batches()
        time.sleep(max(0.0, BULK_WINDOW_S - (time.monotonic() - started)))
        rate = (_answers(sessions, bulk) - before) / (time.monotonic() - started)
        for job_id in bulk:
            self.cancel(job_id)
        sessions.kw["bind"].dispose()
        return FloodResult(self.layout, [(at - created).total_seconds() for at in answered],
                           before, rate, None if slots_before is None
                           else (slots_after or 0) - slots_before)

    def slot_batches(self) -> int | None:
        """Batches the workers' realtime slots have taken since they started (Celery's
        own count, `inspect stats`, of the slots that answer); None in the layouts
        without slots."""
        if self.layout != "default":
            return None
        app = Celery(broker=self.redis_url)
        try:
            nodes = [f"flood{n}-realtime@qftest" for n in range(len(LAYOUTS[self.layout]))]
            stats = app.control.inspect(destination=nodes, timeout=5).stats() or {}
        finally:
            app.close()
        return sum(sum(found.get("total", {}).values()) for found in stats.values())


    @staticmethod
    def _wait_answered(sessions: sessionmaker[Session], job_id: str, lines: int,
                       timeout: float) -> tuple[datetime, list[datetime]]:
        """The job's creation and its lines' answer times, once all are answered."""
        started = time.monotonic()
        while True:
            with sessions() as session:
                created = session.scalar(select(Job.created_at).where(Job.id == job_id))
                answered = list(session.scalars(
                    select(Result.answered_at).where(Result.job_id == job_id)))
            if len(answered) == lines and all(answered):
                return created, answered
            assert time.monotonic() - started < timeout, f"{len(answered)} of {lines} answered"
            time.sleep(0.1)


def _answers(sessions: sessionmaker[Session], job_ids: list[str]) -> int:
    with sessions() as session:
        return session.scalar(select(func.count()).select_from(Result)
                              .where(Result.job_id.in_(job_ids))) or 0

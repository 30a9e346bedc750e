"""A whole cluster on servers of its own, for faults: PostgreSQL and Redis we may stop,
kill or restart, the API, four workers and a strict mock provider, all on defaults.

Each fault test prints one row of the reliability table (docs/operations/reliability.md):
the rows are collected here and shown at the end of the test session
(conftest.pytest_terminal_summary).
"""

import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis

from quotaflow.db import session_factory
from tests.harness.cluster import deployment_file, results_stored, start_provider, start_workers
from tests.harness.factories import chat_line, jsonl
from tests.harness.procs import Proc, free_port, quiet_port, quotaflow
from tests.harness.servers import service_env

LINES = 1000
RPM = 1200  # the provider's and the deployment's: the job needs 50 s of budget
BURST_S = 10  # both enforce it over 10 s: 200 requests at most at once, then 20 a second
LATENCY_MS = 200
WORKERS = 4
CONCURRENCY = 2
# Calls a crash can catch in flight: every worker's pool processes, each with a batch's
# max_concurrency requests out (quotaflow.config.Settings.max_concurrency).
IN_FLIGHT_BOUND = WORKERS * CONCURRENCY * 16
# A fault must be over this long after it ends, plus what the rest of the job needs.
RESUME_ALLOWANCE_S = 30.0

HEADER = ("fault", "lost", "duplicated results", "provider repeats", "peak in flight",
          "seconds to resume", "seconds to finish (allowed)")
ROWS: list[tuple[str, ...]] = []


def table() -> str:
    rows = [HEADER, *ROWS]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
                     for row in rows)


class OwnRedis:
    """A redis-server on its own port and directory, with or without an append-only file."""

    def __init__(self, workdir: Path, aof: bool) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is installed by scripts/test"
        self.argv = [binary, "--port", str(quiet_port()), "--bind", "127.0.0.1", "--save", "",
                     "--dir", str(workdir), "--appendonly", "yes" if aof else "no",
                     "--appendfsync", "always"]
        self.port = int(self.argv[2])
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.popen: subprocess.Popen | None = None

    def start(self) -> None:
        self.popen = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL)
        client = redis.Redis(port=self.port)
        for _ in range(200):
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise TimeoutError("our redis did not start")

    def stop(self) -> None:
        """A clean shutdown: with an append-only file, everything written is kept."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.terminate()
            self.popen.wait(10)


@dataclass
class Progress:
    job_id: str


class ChaosCluster:
    def __init__(self, tmp_path: Path, pg_url: str, aof: bool = False) -> None:
        self.tmp_path = tmp_path
        self.pg_url = pg_url
        self.sessions = session_factory(pg_url)
        self.redis = OwnRedis(tmp_path, aof)
        self.procs: list[Proc] = []
        self.workers: list[Proc] = []
        self.api_url = ""
        self.provider_url = ""

    def start(self) -> None:
        self.redis.start()
        provider, self.provider_url = start_provider(
            self.tmp_path, "--rpm", str(RPM), "--tpm", "100000000",
            "--burst-seconds", str(BURST_S), "--latency-ms", str(LATENCY_MS))
        self.procs.append(provider)
        deployments = deployment_file(self.tmp_path, "strict", self.provider_url, rpm=RPM,
                                      burst_seconds=BURST_S)
        env = service_env(QUOTAFLOW_DATABASE_URL=self.pg_url,
                          QUOTAFLOW_BROKER_URL=self.redis.url,
                          QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments), QUOTAFLOW_AUTH="false")
        port = free_port()
        api = Proc("api", quotaflow("api", "--port", str(port)), env, self.tmp_path)
        self.procs.append(api)
        self.api_url = f"http://127.0.0.1:{port}"
        api.wait_http(f"{self.api_url}/healthz")
        self.workers = start_workers(env, self.tmp_path, "chaos", count=WORKERS,
                                     concurrency=CONCURRENCY)
        self.procs += self.workers

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.redis.stop()
        self.sessions.kw["bind"].dispose()

    def submit(self) -> Progress:
        data = jsonl([chat_line(f"c{i}", prompt=f"question {i}") for i in range(LINES)])
        answer = httpx.post(f"{self.api_url}/jobs", files={"file": ("chaos.jsonl", data)},
                            data={"queue": "standard"}, timeout=60)
        assert answer.status_code == 201, answer.text
        return Progress(answer.json()["id"])

    def done(self, job: Progress) -> int:
        return results_stored(self.sessions, job.job_id)

    def wait_for(self, job: Progress, results: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while self.done(job) < results:
            assert time.monotonic() < deadline, f"{self.done(job)} of {results} after {timeout}s"
            time.sleep(0.1)

    def provider_stats(self) -> dict:
        return httpx.get(f"{self.provider_url}/stats", timeout=10).json()

"""Short and long requests against RPM and TPM together: the cluster and the measurement
that tests/cluster/test_size_aware.py asserts on and bench/long_ratio.py sweeps.

A strict mock provider enforces 2,400 RPM and TPM per second (burst 1 s, so a job's
first second is no head start) and gives nothing back (--no-reconcile: a request
costs its prompt plus its max_tokens, as the limiter counts it). A short request
costs 20 tokens, a long one 300; TPM is set so that a file with half of each needs
RPM and TPM alike. Four workers run a job of `lines` lines, a `long_ratio` share of
them long, sorted (shorts first: "clustered") or shuffled, in batches of BATCH_SIZE,
with QUOTAFLOW_ADMISSION_ORDER fifo (line order) or mixed (quotaflow/dispatch/mixing.py). The
lower bound is max(requests / RPM, tokens / TPM).
"""

import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.db import session_factory
from quotaflow.models import Job, Result
from tests.harness.cluster import start_provider
from tests.harness.factories import jsonl
from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import service_env

RPM = 2400
SHORT = (10, 10)  # (prompt tokens, max_tokens)
LONG = (100, 200)
TPM = RPM * (sum(SHORT) + sum(LONG)) // 2  # half and half needs both limits alike
LATENCY_MS = 50
WORKERS = 4
# Scaled down with the jobs: the workers hold 8 batches at once, and line order can only
# hurt a file much longer than that window (a 100,000-line file at the default 100 is; a
# 600-line one at 100 is in flight whole). At 10 the window is 80 lines.
BATCH_SIZE = 10


def line(custom_id: str, long: bool) -> dict:
    prompt, max_tokens = LONG if long else SHORT
    text = f"{custom_id:<12}" + "x" * (prompt * 4 - 12)  # characters / 4 = prompt tokens
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "max_tokens": max_tokens,
                     "messages": [{"role": "user", "content": text}]}}


def job_lines(lines: int, long_ratio: float, clustered: bool, seed: int = 7) -> list[dict]:
    longs = round(lines * long_ratio)
    kinds = [False] * (lines - longs) + [True] * longs
    if not clustered:
        random.Random(seed).shuffle(kinds)
    return [line(f"{'L' if long else 'S'}{i}", long) for i, long in enumerate(kinds)]


def lower_bound_s(lines: list[dict]) -> float:
    tokens = sum(sum(LONG if row["custom_id"][0] == "L" else SHORT) for row in lines)
    return max(len(lines) / (RPM / 60), tokens / (TPM / 60))


@dataclass
class Run:
    order: str
    seconds: float  # first admission to last answer
    lower_bound_s: float
    short_p95_s: float  # from the first admission to each line's answer
    long_p95_s: float
    rejected_429: int

    @property
    def of_bound(self) -> float:
        return self.seconds / self.lower_bound_s


def _p95(values: list[float]) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=20)[-1]


class MixCluster:
    """The provider, the API and four workers, for one admission order."""

    def __init__(self, tmp_path: Path, pg_url: str, redis_url: str, order: str,
                 batch_size: int = BATCH_SIZE) -> None:
        self.tmp_path, self.pg_url, self.order = tmp_path, pg_url, order
        self.batch_size = batch_size
        self.redis_url = redis_url
        self.procs: list[Proc] = []
        self.api_url = self.provider_url = ""

    def __enter__(self) -> "MixCluster":
        provider, self.provider_url = start_provider(
            self.tmp_path, "--rpm", str(RPM), "--tpm", str(TPM), "--burst-seconds", "1",
            "--latency-ms", str(LATENCY_MS), "--no-reconcile")
        self.procs.append(provider)
        deployments = self.tmp_path / "deployments.toml"
        deployments.write_text(
            f'[deployments.strict]\nprovider = "openai"\nbase_url = "{self.provider_url}/v1"\n'
            f'model = "m"\nrpm = {RPM}\ntpm = {TPM}\nburst_seconds = 1\n'
            'reconcile_usage = false\n[routes]\n"*" = "strict"\n')
        env = service_env(QUOTAFLOW_DATABASE_URL=self.pg_url, QUOTAFLOW_BROKER_URL=self.redis_url,
                          QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments), QUOTAFLOW_AUTH="false",
                          QUOTAFLOW_ADMISSION_ORDER=self.order,
                          QUOTAFLOW_BATCH_SIZE=str(self.batch_size),
                          QUOTAFLOW_LARGEST_BATCH_SIZE=str(self.batch_size))
        port = free_port()
        self.procs.append(Proc("api", quotaflow("api", "--port", str(port)), env, self.tmp_path))
        self.api_url = f"http://127.0.0.1:{port}"
        self.procs[-1].wait_http(f"{self.api_url}/healthz")
        workers = [Proc(f"worker{n}", quotaflow("worker", "--concurrency", "2", "--name",
                                                f"mix{n}@qftest"), env, self.tmp_path)
                   for n in range(WORKERS)]
        for worker in workers:
            worker.wait_until(lambda w=worker: " ready." in w.log())
        self.procs += workers
        return self

    def __exit__(self, *_exc: object) -> None:
        for proc in reversed(self.procs):
            proc.stop()

    def run(self, lines: list[dict], timeout: float = 240.0) -> Run:
        before = httpx.get(f"{self.provider_url}/stats", timeout=10).json()["rejected_429"]
        answer = httpx.post(f"{self.api_url}/jobs", files={"file": ("mix.jsonl", jsonl(lines))},
                            data={"queue": "standard"}, timeout=60)
        assert answer.status_code == 201, answer.text
        job_id = answer.json()["id"]
        sessions = session_factory(self.pg_url)
        try:
            _wait(sessions, job_id, timeout)
            with sessions() as session:
                rows = session.execute(select(Result.custom_id, Result.admitted_at,
                                              Result.answered_at)
                                       .where(Result.job_id == job_id)).all()
        finally:
            sessions.kw["bind"].dispose()
        assert len(rows) == len(lines) and all(admitted for _, admitted, _ in rows)
        start = min(admitted for _, admitted, _ in rows)
        waits = {kind: [(answered - start).total_seconds() for cid, _, answered in rows
                        if cid[0] == kind] for kind in "SL"}
        end = max(answered for *_, answered in rows)
        rejected = httpx.get(f"{self.provider_url}/stats", timeout=10).json()["rejected_429"]
        return Run(self.order, (end - start).total_seconds(), lower_bound_s(lines),
                   _p95(waits["S"]), _p95(waits["L"]), rejected - before)


def _wait(sessions: sessionmaker[Session], job_id: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with sessions() as session:
            status = session.scalar(select(Job.status).where(Job.id == job_id))
        if status not in ("validating", "in_progress", "finalizing"):
            assert status == "completed", status
            return
        assert time.monotonic() < deadline, f"job {job_id} still {status}"
        time.sleep(0.2)

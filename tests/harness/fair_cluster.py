"""Fair shares between tenants: the cluster, the submissions and the measurement that
tests/cluster/test_fair_share.py asserts on and bench/fair_share.py prints.

A strict mock provider admits 20 requests a second (1,200 RPM enforced per second:
burst_seconds 1), 200 ms a call; three workers of two slots consume `standard,bulk`.
Scaled down from minutes: the issue's "within 10% over any minute" is measured here
over windows of WINDOW_S seconds (100 requests of budget each), and "starts within
seconds" as the late job's first answer after its submission.

Tenants submit bulk jobs through the API with their own keys (weights set by
auth.create_key, as `quotaflow keys create --weight` does); every answer's admission
time (results.admitted_at) says whose request took which part of the budget.
"""

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.db import session_factory
from quotaflow.models import Job, Result
from quotaflow.tenants import keys as auth
from tests.harness.cluster import deployment_file, start_provider
from tests.harness.factories import chat_line, jsonl
from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import service_env

RPM = 1200
LATENCY_MS = 200
WORKERS = 3
WINDOW_S = 5.0


@dataclass(frozen=True)
class Submission:
    tenant: str
    weight: float
    lines: int
    at_s: float  # seconds after the first submission


@dataclass
class TenantRun:
    submission: Submission
    job_id: str = ""
    submitted: datetime | None = None
    admitted: list[float] = field(default_factory=list)  # unix seconds
    answered: list[float] = field(default_factory=list)

    @property
    def first_answer_s(self) -> float | None:
        """From the job's creation to its first answer."""
        if not self.answered or self.submitted is None:
            return None
        return min(self.answered) - self.submitted.timestamp()


@dataclass
class FairCluster:
    """A provider, the API and three workers, on the caller's PostgreSQL and a Redis db
    of its own (flushed by the caller). `fair`: QUOTAFLOW_FAIR_SHARE."""

    tmp_path: Path
    pg_url: str
    redis_url: str
    fair: bool = True
    procs: list[Proc] = field(default_factory=list)
    api_url: str = ""
    provider_url: str = ""

    def start(self) -> None:
        provider, self.provider_url = start_provider(
            self.tmp_path, "--rpm", str(RPM), "--tpm", "100000000",
            "--burst-seconds", "1", "--latency-ms", str(LATENCY_MS))
        self.procs.append(provider)
        deployments = deployment_file(self.tmp_path, "strict", self.provider_url, rpm=RPM,
                                      burst_seconds=1)
        env = service_env(QUOTAFLOW_DATABASE_URL=self.pg_url, QUOTAFLOW_BROKER_URL=self.redis_url,
                          QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments),
                          QUOTAFLOW_FAIR_SHARE=str(self.fair).lower())
        port = free_port()
        api = Proc("api", quotaflow("api", "--port", str(port)), env, self.tmp_path)
        self.procs.append(api)
        self.api_url = f"http://127.0.0.1:{port}"
        api.wait_http(f"{self.api_url}/healthz")
        workers = [Proc(f"worker{n}", quotaflow("worker", "--queues", "standard,bulk",
                                                "--concurrency", "2",
                                                "--name", f"fair{n}@qftest"),
                        env, self.tmp_path)
                   for n in range(WORKERS)]
        for worker in workers:
            worker.wait_until(lambda w=worker: " ready." in w.log())
        self.procs += workers

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()

    def rejected_429(self) -> int:
        return int(httpx.get(f"{self.provider_url}/stats", timeout=10).json()["rejected_429"])

    def run(self, submissions: Sequence[Submission], measure_s: float,
            tag: str = "") -> list[TenantRun]:
        """Submit each tenant's job at its time, let them run for measure_s after the
        first, cancel what is left, and read every answer's admission time."""
        sessions = session_factory(self.pg_url)
        keys = {s.tenant: auth.create_key(sessions, s.tenant + tag, weight=s.weight).secret
                for s in submissions}
        runs = [TenantRun(s) for s in sorted(submissions, key=lambda s: s.at_s)]
        started = time.monotonic()
        for run in runs:
            time.sleep(max(0.0, started + run.submission.at_s - time.monotonic()))
            run.job_id = self._submit(keys[run.submission.tenant], run.submission)
        time.sleep(max(0.0, started + measure_s - time.monotonic()))
        for run in runs:
            httpx.post(f"{self.api_url}/jobs/{run.job_id}/cancel", timeout=30,
                       headers={"Authorization": f"Bearer {keys[run.submission.tenant]}"})
        time.sleep(1.0)
        for run in runs:
            _read(sessions, run)
        sessions.kw["bind"].dispose()
        return runs

    def _submit(self, key: str, submission: Submission) -> str:
        data = jsonl([chat_line(f"{submission.tenant}{i}",
                                prompt=f"{submission.tenant} question {i}")
                      for i in range(submission.lines)])
        answer = httpx.post(f"{self.api_url}/jobs", files={"file": ("f.jsonl", data)},
                            data={"queue": "bulk"}, timeout=60,
                            headers={"Authorization": f"Bearer {key}"})
        assert answer.status_code == 201, answer.text
        return answer.json()["id"]


def _read(sessions: sessionmaker[Session], run: TenantRun) -> None:
    with sessions() as session:
        run.submitted = session.scalar(select(Job.created_at).where(Job.id == run.job_id))
        rows = session.execute(select(Result.admitted_at, Result.answered_at)
                               .where(Result.job_id == run.job_id,
                                      Result.admitted_at.is_not(None))).all()
    run.admitted = sorted(a.timestamp() for a, _ in rows)
    run.answered = sorted(b.timestamp() for _, b in rows if b is not None)


def both_running(a: TenantRun, b: TenantRun) -> tuple[float, float]:
    """The span in which both tenants had requests admitted: from the later one's first
    admission to the earlier of their last ones."""
    return max(a.admitted[0], b.admitted[0]), min(a.admitted[-1], b.admitted[-1])


def windows(a: TenantRun, b: TenantRun, window_s: float = WINDOW_S,
            settle_s: float = 2.0) -> list[tuple[float, float]]:
    """Windows of window_s while both ran (after settle_s: the later tenant's batches
    reaching workers)."""
    if not a.admitted or not b.admitted:
        return []
    start, end = both_running(a, b)
    start += settle_s
    spans = []
    while start + window_s <= end:
        spans.append((start, start + window_s))
        start += window_s
    return spans


def admitted_in(run: TenantRun, span: tuple[float, float]) -> int:
    return sum(span[0] <= t < span[1] for t in run.admitted)


def window_shares(a: TenantRun, b: TenantRun, window_s: float = WINDOW_S,
                  settle_s: float = 2.0) -> list[float]:
    """a's share of the requests a and b were admitted, per window while both ran."""
    shares = []
    for span in windows(a, b, window_s, settle_s):
        na, nb = admitted_in(a, span), admitted_in(b, span)
        shares.append(na / (na + nb) if na + nb else 0.0)
    return shares

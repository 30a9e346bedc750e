"""The API under a crowd (issue 45): the cluster, a large job running on it, the job's own
rate, and a full recount of its request counts; tests/cluster/test_api_crowd.py asserts
on it and bench/api_load.py prints its table (the clients are tests/harness/api_clients.py).

The cluster is an unlimited mock provider at a given latency, `quotaflow api` (several
processes where `--workers` exists) and plain `quotaflow worker`s, each keeping a slot for
the realtime queue, on the caller's PostgreSQL database and Redis db (made fresh by the
caller). The large job's lines ask for the model `gpt-4o-mini`; the submitters' small jobs
for `realtime-model`: each has a deployment of its own on the same provider, so a test can
slow the large job down (`big_rpm`) to keep it running through the load while the small
jobs are answered at the provider's latency.
"""

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.config import Settings
from quotaflow.db import session_factory
from quotaflow.models import Result
from quotaflow.tenants.keys import create_key
from tests.harness.cluster import start_provider, start_workers
from tests.harness.factories import chat_line, jsonl
from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import ROOT, service_env

BIG_MODEL = "gpt-4o-mini"
SMALL_MODEL = "realtime-model"
UNBOUND_RPM = 1_000_000_000
RUNNING = ("validating", "in_progress", "finalizing")  # a job's statuses before its last
# The API's per-key request limit (QUOTAFLOW_API_RATE_LIMIT, where this checkout has it):
# the crowd's requests carry one key, and without a key they count against 127.0.0.1, so
# the bench and the test turn it off; a limit is not what they measure.
KEY_LIMIT_OFF = {"api_rate_limit": "off"}


def key_limit_off_env() -> dict[str, str]:
    """QUOTAFLOW_* variables that turn the per-key API limit off, where Settings has it."""
    fields = Settings.model_fields
    return {f"QUOTAFLOW_{name.upper()}": value for name, value in KEY_LIMIT_OFF.items()
            if name in fields}


def api_has_workers_option() -> bool:
    """Whether `quotaflow api` takes --workers (several API processes) in this checkout."""
    shown = subprocess.run(quotaflow("api", "--help"), capture_output=True, text=True,
                           timeout=60, env=service_env(PYTHONPATH=str(ROOT)))
    return "--workers" in shown.stdout


def api_has_long_poll(api_url: str) -> bool:
    """Whether GET /jobs/{id} takes `wait` (a long-poll), as the API's schema says."""
    schema = httpx.get(f"{api_url}/openapi.json", timeout=30).json()
    parameters = schema["paths"].get("/jobs/{job_id}", {}).get("get", {}).get("parameters", [])
    return any(parameter.get("name") == "wait" for parameter in parameters)


def small_job(lines: int) -> bytes:
    return jsonl([chat_line(f"rt-{n}", prompt=f"realtime question {n}", model=SMALL_MODEL,
                            max_tokens=16) for n in range(lines)])


def big_job_lines(lines: int) -> Iterator[bytes]:
    """The large job's JSONL in chunks: distinct prompts, so nothing is deduplicated."""
    for start in range(0, lines, 10_000):
        yield jsonl([chat_line(f"big-{n:07d}", prompt=f"large job question {n}",
                               model=BIG_MODEL, max_tokens=16)
                     for n in range(start, min(lines, start + 10_000))])


def recount(sessions: sessionmaker[Session], job_id: str) -> dict[str, int]:
    """The job's request counts from its items, counted in full (what the API reports)."""
    with sessions() as session:
        rows: dict[str, int] = dict(session.execute(text(
            "SELECT status, count(*) FROM items WHERE job_id = :job GROUP BY status"),
            {"job": job_id}).all())
    return {"completed": rows.get("succeeded", 0),
            "failed": rows.get("failed", 0) + rows.get("spend_limited", 0),
            "pending": sum(rows.get(s, 0) for s in ("pending", "running", "waiting")),
            "cancelled": rows.get("cancelled", 0), "expired": rows.get("expired", 0)}


@dataclass
class LoadCluster:
    """Provider, API and workers for a crowd; `stop` ends each by its pid."""

    tmp_path: Path
    pg_url: str
    redis_url: str
    provider_ms: float = 20.0
    api_workers: int = 1
    workers: int = 2
    auth: bool = True
    big_rpm: int = UNBOUND_RPM
    procs: list[Proc] = field(default_factory=list)
    api_url: str = ""
    provider_url: str = ""
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.sessions = session_factory(self.pg_url)

    def start(self) -> None:
        provider, provider_url = start_provider(
            self.tmp_path, "--unlimited", "--latency-ms", f"{self.provider_ms:g}")
        self.procs.append(provider)
        self.provider_url = provider_url
        deployments = self.tmp_path / "deployments.toml"
        burst = "burst_seconds = 1\n" if self.big_rpm != UNBOUND_RPM else ""
        deployments.write_text("".join(
            f'[deployments.{name}]\nprovider = "openai"\nbase_url = "{provider_url}/v1"\n'
            f'model = "{name}"\nrpm = {rpm}\n{burst if name == "big" else ""}'
            "tpm = 100000000000\n" for name, rpm in (("big", self.big_rpm),
                                                     ("small", UNBOUND_RPM)))
            + f'[routes]\n"{BIG_MODEL}" = "big"\n"*" = "small"\n')
        env = service_env(PYTHONPATH=str(ROOT), QUOTAFLOW_DATABASE_URL=self.pg_url,
                          QUOTAFLOW_BROKER_URL=self.redis_url,
                          QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments),
                          QUOTAFLOW_AUTH="true" if self.auth else "false",
                          **key_limit_off_env())
        port = free_port()
        several = ("--workers", str(self.api_workers)) if self.api_workers > 1 else ()
        api = Proc("api", quotaflow("api", "--port", str(port), *several), env, self.tmp_path)
        self.procs.append(api)
        self.api_url = f"http://127.0.0.1:{port}"
        api.wait_http(f"{self.api_url}/healthz")
        self.procs += start_workers(env, self.tmp_path, "load", self.workers)
        if self.auth:
            key = create_key(self.sessions, "crowd")
            self.headers = {"Authorization": f"Bearer {key.secret}"}

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.procs.clear()
        self.sessions.kw["bind"].dispose()

    def submit_big(self, lines: int, timeout: float = 1800.0) -> str:
        """Make the large job (bulk queue) by streaming its JSONL; its id."""
        answer = httpx.post(f"{self.api_url}/jobs/jsonl", params={"queue": "bulk"},
                            content=big_job_lines(lines), timeout=timeout,
                            headers={**self.headers, "Content-Type": "application/jsonl"})
        assert answer.status_code == 201, answer.text
        return answer.json()["id"]

    def answered(self, job_id: str) -> int:
        """Lines of the job with a result stored: its progress, read past the API."""
        with self.sessions() as session:
            return session.scalar(select(func.count()).select_from(Result)
                                  .where(Result.job_id == job_id)) or 0

    def status(self, job_id: str) -> str:
        with self.sessions() as session:
            return session.scalar(text("SELECT status FROM jobs WHERE id = :job"),
                                  {"job": job_id})

    def wait_finished(self, job_id: str, timeout: float) -> str:
        """Wait (bounded) for the job to leave validating/in_progress; its status."""
        deadline = time.monotonic() + timeout
        while (status := self.status(job_id)) in RUNNING:
            assert time.monotonic() < deadline, (
                f"{job_id} still {status} after {timeout:.0f} s, "
                f"{self.answered(job_id)} answered")
            time.sleep(0.5)
        return status

    def recount(self, job_id: str) -> dict[str, int]:
        return recount(self.sessions, job_id)

    def results_per_job(self, job_ids: list[str]) -> dict[str, int]:
        """Results stored per job, for the given jobs (a job with none is left out)."""
        with self.sessions() as session:
            return dict(session.execute(
                select(Result.job_id, func.count()).where(Result.job_id.in_(job_ids))
                .group_by(Result.job_id)).all())

    def recover(self, job_id: str, timeout: float = 120.0) -> float | None:
        """Wait (bounded) until one read of the job is answered within 2 s, so that a crowd
        starts on an API that is not still working off the last one's abandoned requests;
        the seconds that took (None: no answer within `timeout`)."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            try:
                if httpx.get(f"{self.api_url}/jobs/{job_id}", headers=self.headers,
                             timeout=2).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        return None

    def reported_counts(self, job_id: str, timeout: float = 15.0) -> dict[str, int] | str:
        """The request counts GET /jobs/{id} reports (without `total`), or what went wrong
        instead: an API still stalled by a crowd that has left is what a test reports."""
        try:
            answer = httpx.get(f"{self.api_url}/jobs/{job_id}", headers=self.headers,
                               timeout=timeout)
        except httpx.HTTPError as exc:
            return f"no answer: {type(exc).__name__} {exc}"
        if answer.status_code != 200:
            return f"HTTP {answer.status_code}: {answer.text[:300]}"
        counts = dict(answer.json()["request_counts"])
        counts.pop("total")
        return counts

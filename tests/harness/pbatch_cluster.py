"""Provider batch APIs against real upstreams, for tests/cluster/test_pbatch_cluster.py.

Upstream: a second quotaflow (its own API, a Celery worker, a strict mock provider, its
own database qf_pbatch_up and Redis db 10) whose /v1/files + /v1/batches an
`openai-batch` deployment uploads to with an upstream API key; and strict mock
providers serving Anthropic's /v1/messages/batches (quick, mid and slow batches).
Downstream: Celery workers on the test database whose deployments file names both.
"""

import io
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from sqlalchemy import select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.config import Settings
from quotaflow.db import session_factory, upgrade
from quotaflow.ingest import pipeline
from quotaflow.models import Job
from quotaflow.offload.batch_tables import ProviderBatch
from tests.harness.factories import jsonl
from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import (
    PG_URL,
    REDIS_URL,
    ROOT,
    flush_redis,
    recreate_database,
    service_env,
)
from workers.dispatch import CeleryDispatcher

UP_DB = make_url(PG_URL).set(database="qf_pbatch_up").render_as_string(hide_password=False)
UP_REDIS = REDIS_URL.rsplit("/", 1)[0] + "/10"
PROVIDER_KEY = "sk-pbatch-mock-0123456789"
# Batch prices (half the realtime ones), per million tokens.
BATCH_IN, BATCH_OUT = 0.5, 1.5
REALTIME_IN, REALTIME_OUT = 1.0, 3.0
MOCK_BATCH_SECONDS = {"fast": 0.5, "mid": 6, "slow": 600}


@dataclass
class Cluster:
    env: dict[str, str]
    workdir: Path
    procs: dict[str, Proc]
    mocks: dict[str, str]
    up_url: str
    up_sessions: sessionmaker[Session]
    workers: list[Proc] = field(default_factory=list)

    @property
    def settings(self) -> Settings:
        return Settings(database_url=self.env["QUOTAFLOW_DATABASE_URL"],
                        broker_url=REDIS_URL,
                        deployments_file=Path(self.env["QUOTAFLOW_DEPLOYMENTS_FILE"]),
                        _env_file=None)

    def start_worker(self, **env: str) -> Proc:
        name = f"down{len(self.workers) + 1}"
        worker = Proc(name, quotaflow("worker", "--concurrency", "2", "--name",
                                      f"{name}@qfpbatch"), {**self.env, **env}, self.workdir)
        worker.wait_until(lambda: " ready." in worker.log())
        self.workers.append(worker)
        return worker

    def kill_worker(self, worker: Proc) -> None:
        """SIGKILL the worker's whole process group: no shutdown, no cleanup."""
        os.killpg(worker.pid, signal.SIGKILL)
        worker.popen.wait(10)

    def submit(self, sessions: sessionmaker[Session], lines: list[dict],
               queue: str = "bulk", **options: str) -> str:
        settings = self.settings
        job = pipeline.create_job_in_process(
            sessions, io.BytesIO(jsonl(lines)), settings=settings,
            deployments=settings.load_deployments(), dispatcher=CeleryDispatcher(REDIS_URL),
            queue=queue, **options)
        return job.id

    def wait(self, sessions: sessionmaker[Session], job_id: str, timeout: float = 45) -> str:
        deadline = time.monotonic() + timeout
        while True:
            with sessions() as session:
                status = session.scalar(select(Job.status).where(Job.id == job_id))
            if status in ("completed", "failed", "expired", "cancelled"):
                return status
            assert time.monotonic() < deadline, (
                f"job {job_id} still {status}\n" + "\n".join(w.log(3000) for w in self.workers))
            time.sleep(0.3)

    def batches(self, sessions: sessionmaker[Session], job_id: str) -> list[ProviderBatch]:
        with sessions() as session:
            return list(session.scalars(select(ProviderBatch)
                                        .where(ProviderBatch.job_id == job_id)))

    def wait_submitted(self, sessions: sessionmaker[Session], job_id: str,
                       timeout: float = 30) -> ProviderBatch:
        deadline = time.monotonic() + timeout
        while True:
            found = [b for b in self.batches(sessions, job_id) if b.provider_id]
            if found:
                return found[0]
            assert time.monotonic() < deadline, "\n".join(w.log(3000) for w in self.workers)
            time.sleep(0.2)

    def anthropic_batches(self, mock: str) -> list[dict]:
        return httpx.get(f"{self.mocks[mock]}/v1/messages/batches",
                         headers={"x-api-key": PROVIDER_KEY}, timeout=5).json()["data"]


def _deployments(path: Path, up: str, up_mock: str, mocks: dict[str, str]) -> None:
    prices = f"input_per_mtok = {BATCH_IN}\noutput_per_mtok = {BATCH_OUT}\n"
    realtime = f"input_per_mtok = {REALTIME_IN}\noutput_per_mtok = {REALTIME_OUT}\n"
    text = f"""
[deployments.obatch]
provider = "openai-batch"
base_url = "{up}/v1"
model = "up-model"
api_key_env = "QF_UP_KEY"
{prices}
[deployments.rt-openai]
provider = "openai"
base_url = "{up_mock}/v1"
model = "up-model"
api_key_env = "QF_PROVIDER_KEY"
rpm = 60000
tpm = 50000000
{realtime}
[deployments.rt-anthropic]
provider = "anthropic"
base_url = "{mocks['fast']}"
model = "claude-rt"
api_key_env = "QF_PROVIDER_KEY"
rpm = 60000
tpm = 50000000
{realtime}
"""
    for speed, url in mocks.items():
        text += (f'[deployments.abatch-{speed}]\nprovider = "anthropic-batch"\n'
                 f'base_url = "{url}"\nmodel = "claude-{speed}"\n'
                 f'api_key_env = "QF_PROVIDER_KEY"\n{prices}\n')
    text += """[routes]
"up-model" = { deployments = ["obatch"], fallback = ["rt-openai"] }
"claude-fast" = { deployments = ["abatch-fast"], fallback = ["rt-anthropic"] }
"claude-mid" = "abatch-mid"
"claude-slow" = "abatch-slow"
"""
    path.write_text(text)


def start(pg_url: str, workdir: Path) -> Iterator[Cluster]:
    """Generator for a module fixture: the upstream, the mocks and one downstream worker."""
    flush_redis(REDIS_URL)
    flush_redis(UP_REDIS)
    recreate_database(UP_DB)
    upgrade(UP_DB)
    procs: dict[str, Proc] = {}
    base_env = service_env(PYTHONPATH=str(ROOT), QF_PROVIDER_KEY=PROVIDER_KEY)
    cluster: Cluster | None = None
    try:
        ports = {name: free_port() for name in ("up-api", "up-mock", *MOCK_BATCH_SECONDS)}
        urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        for name in ("up-mock", *MOCK_BATCH_SECONDS):
            seconds = str(MOCK_BATCH_SECONDS.get(name, 1))
            procs[name] = Proc(name, quotaflow(
                "mock-provider", "--port", str(ports[name]), "--rpm", "60000", "--tpm",
                "50000000", "--latency-ms", "2", "--api-key-env", "QF_PROVIDER_KEY"),
                {**base_env, "QUOTAFLOW_MOCK_BATCH_SECONDS": seconds}, workdir)
        up_deployments = workdir / "upstream.toml"
        up_deployments.write_text(
            f'[deployments.up]\nprovider = "openai"\nbase_url = "{urls["up-mock"]}/v1"\n'
            'model = "up-model"\napi_key_env = "QF_PROVIDER_KEY"\nrpm = 60000\n'
            'tpm = 50000000\n[routes]\n"*" = "up"\n')
        up_env = {**base_env, "QUOTAFLOW_DATABASE_URL": UP_DB, "QUOTAFLOW_BROKER_URL": UP_REDIS,
                  "QUOTAFLOW_DEPLOYMENTS_FILE": str(up_deployments)}
        procs["up-api"] = Proc("up-api", quotaflow("api", "--port", str(ports["up-api"])),
                               up_env, workdir)
        procs["up-worker"] = Proc("up-worker", quotaflow(
            "worker", "--concurrency", "1", "--name", "up1@qfpbatch"), up_env, workdir)
        for name in ("up-mock", *MOCK_BATCH_SECONDS):
            procs[name].wait_http(f"{urls[name]}/healthz")
        procs["up-api"].wait_http(f"{urls['up-api']}/healthz")
        procs["up-worker"].wait_until(lambda: " ready." in procs["up-worker"].log())
        made = subprocess.run(quotaflow("keys", "create", "--tenant", "downstream"),
                              env=up_env, capture_output=True, text=True, timeout=60,
                              cwd=workdir)
        assert made.returncode == 0, made.stderr
        deployments = workdir / "downstream.toml"
        _deployments(deployments, urls["up-api"], urls["up-mock"],
                     {name: urls[name] for name in MOCK_BATCH_SECONDS})
        env = {**base_env, "QF_UP_KEY": made.stdout.strip(),
               "QUOTAFLOW_DATABASE_URL": pg_url, "QUOTAFLOW_BROKER_URL": REDIS_URL,
               "QUOTAFLOW_DEPLOYMENTS_FILE": str(deployments),
               "QUOTAFLOW_PROVIDER_BATCH_GATHER_S": "0.3",
               "QUOTAFLOW_PROVIDER_BATCH_POLL_S": "0.3",
               "QUOTAFLOW_PROVIDER_BATCH_LEASE_S": "3",
               "QUOTAFLOW_WEBHOOK_DELIVERY": "false"}
        cluster = Cluster(env, workdir, procs, {n: urls[n] for n in MOCK_BATCH_SECONDS},
                          urls["up-api"], session_factory(UP_DB))
        cluster.start_worker()
        yield cluster
    finally:
        for worker in cluster.workers if cluster else []:
            worker.stop()
        for proc in reversed(procs.values()):
            proc.stop()

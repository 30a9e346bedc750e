"""A quotaflow cluster with API keys on, for the OpenAI-compatible API tests: the real
API process (uvicorn), two Celery workers, Redis, Postgres and HTTP mock providers.

Keys are made with the real `quotaflow keys create` command, as an operator would.
"""

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import REDIS_URL, ROOT, flush_redis, service_env

PROVIDER_KEY = "sk-quotaflow-v1-test-0123456789abcdef"
UPLOAD_LIMIT = 2_000_000
FINAL = ("completed", "failed", "expired", "cancelled")


@dataclass
class V1Cluster:
    api_url: str
    env: dict[str, str]
    procs: dict[str, Proc]
    workdir: Path
    keys: dict[str, str] = field(default_factory=dict)

    @property
    def base_url(self) -> str:
        return f"{self.api_url}/v1"

    def cli(self, *args: str, env: dict[str, str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(quotaflow(*args), env=env or self.env, capture_output=True,
                              text=True, timeout=timeout, cwd=self.workdir)

    def create_key(self, tenant: str, *options: str) -> str:
        made = self.cli("keys", "create", "--tenant", tenant, *options)
        assert made.returncode == 0, made.stderr
        key = made.stdout.strip()
        assert key.startswith("qf-") and "\n" not in key
        return key

    def headers(self, tenant: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[tenant]}"}

    def wait_for_batch(self, tenant: str, batch_id: str, timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            batch = httpx.get(f"{self.base_url}/batches/{batch_id}", headers=self.headers(tenant),
                              timeout=10).raise_for_status().json()
            if batch["status"] in FINAL:
                return batch
            assert time.monotonic() < deadline, (
                f"{batch_id} still {batch['status']}: {batch['request_counts']}\n"
                + "\n".join(p.log() for n, p in self.procs.items() if "worker" in n))
            time.sleep(0.3)


# The model of the anthropic deployment start_cluster(anthropic=True) adds.
CLAUDE_MODEL = "claude-sonnet-4-5"


def start_cluster(pg_url: str, workdir: Path, tenants: tuple[str, ...] = ("team-a", "team-b"),
                  workers: int = 2, anthropic: bool = False,
                  **settings: str) -> Iterator[V1Cluster]:
    """Generator for a module fixture: yields the running cluster, then stops every process.

    anthropic: a deployment of CLAUDE_MODEL too, at the strict mock's /v1/messages (the
    same mock process, with the same key in x-api-key)."""
    flush_redis(REDIS_URL)
    ports = {name: free_port() for name in ("api", "provider", "slow")}
    deployments = workdir / "deployments.toml"
    deployments.write_text(f"""
[deployments.fast]
provider = "openai"
base_url = "http://127.0.0.1:{ports['provider']}/v1"
model = "fast-model"
api_key_env = "QF_TEST_PROVIDER_KEY"
rpm = 60000
tpm = 50000000

[deployments.slow]
provider = "openai"
base_url = "http://127.0.0.1:{ports['slow']}/v1"
model = "slow-model"
api_key_env = "QF_TEST_PROVIDER_KEY"
rpm = 60000
tpm = 50000000
max_concurrency = 2

[routes]
"slow" = "slow"
"*" = "fast"
""" + (f"""
[deployments.claude]
provider = "anthropic"
base_url = "http://127.0.0.1:{ports['provider']}"
model = "{CLAUDE_MODEL}"
api_key_env = "QF_TEST_PROVIDER_KEY"
rpm = 60000
itpm = 50000000
otpm = 50000000
""" if anthropic else ""))
    # PYTHONPATH: child processes import this tree even when run from another directory.
    env = service_env(QF_TEST_PROVIDER_KEY=PROVIDER_KEY, PYTHONPATH=str(ROOT),
                      QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                      QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments),
                      QUOTAFLOW_API_URL=f"http://127.0.0.1:{ports['api']}",
                      QUOTAFLOW_MAX_UPLOAD_BYTES=str(UPLOAD_LIMIT), **settings)
    procs: dict[str, Proc] = {}
    try:
        for name, latency in (("provider", "5"), ("slow", "300")):
            procs[name] = Proc(name, quotaflow(
                "mock-provider", "--port", str(ports[name]), "--rpm", "60000", "--tpm",
                "50000000", "--latency-ms", latency, "--api-key-env", "QF_TEST_PROVIDER_KEY"),
                env, workdir)
        procs["api"] = Proc("api", quotaflow("api", "--port", str(ports["api"])), env, workdir)
        for n in range(1, workers + 1):
            procs[f"worker{n}"] = Proc(f"worker{n}", quotaflow(
                "worker", "--concurrency", "2", "--name", f"v1w{n}@qftest"), env, workdir)
        for name in ("provider", "slow"):
            procs[name].wait_http(f"http://127.0.0.1:{ports[name]}/healthz")
        procs["api"].wait_http(f"http://127.0.0.1:{ports['api']}/healthz")
        for n in range(1, workers + 1):
            procs[f"worker{n}"].wait_until(lambda n=n: " ready." in procs[f"worker{n}"].log())
        cluster = V1Cluster(f"http://127.0.0.1:{ports['api']}", env, procs, workdir)
        for tenant in tenants:
            cluster.keys[tenant] = cluster.create_key(tenant)
        yield cluster
    finally:
        for proc in reversed(procs.values()):
            proc.stop()

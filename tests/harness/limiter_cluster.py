"""Four real Celery workers, one strict mock provider per scenario, and the figures that
prove the limiter: 429s, repeated requests, and utilisation.

Used by tests/cluster/test_limiter_cluster.py (the proof) and bench/limiter.py (the table).
utilisation = the provider's binding limit's share: tokens it kept / (bucket capacity +
TPM x minutes from the first admission to the last), or the same for requests and RPM,
whichever is higher: the share of the most the job could have had. A standard or bulk
job leaves its queue's floor of the bucket to realtime, so its capacity here is the
bucket's less that floor.
"""

import io
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from quotaflow.budget.tokens import admission_tokens
from quotaflow.config import Settings
from quotaflow.constants import ENDPOINT_CHAT
from quotaflow.db import session_factory
from quotaflow.ingest import pipeline
from quotaflow.jobs import service as jobs
from quotaflow.jobs import view as job_view
from quotaflow.providers.mock import simulated_body
from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import flush_redis, service_env
from workers.dispatch import CeleryDispatcher

WORKERS = 4
CONCURRENCY = 2
LATENCY_MS = 20


@dataclass(frozen=True)
class Scenario:
    name: str
    rpm: int
    tpm: int
    burst_seconds: float
    max_tokens: int
    provider_refunds: bool  # the provider gives back unused max_tokens after a call
    target_seconds: float
    reconcile: bool | None = None  # the deployment's reconcile_usage; None: the default
    queue: str = "realtime"
    fault_429: float = 0.0  # share of requests the provider refuses at random (overloaded)
    latency_ms: int = LATENCY_MS

    @property
    def floor(self) -> float:
        """The share of each bucket the job's queue leaves to higher priorities."""
        return Settings.model_fields[f"floor_{self.queue}"].default

    @property
    def capacity(self) -> float:
        return self.tpm * self.burst_seconds / 60 * (1 - self.floor)

    @property
    def request_capacity(self) -> float:
        return self.rpm * self.burst_seconds / 60 * (1 - self.floor)

    def lines(self) -> list[dict]:
        """Enough distinct requests to keep the budget busy for about target_seconds."""
        sample = self.body(0)
        cost = admission_tokens(ENDPOINT_CHAT, sample, 0)
        used = simulated_body(ENDPOINT_CHAT, sample)["usage"]["total_tokens"]
        per_item = used if self.provider_refunds else cost
        count = math.ceil(min((self.capacity + self.tpm / 60 * self.target_seconds) / per_item,
                              self.request_capacity + self.rpm / 60 * self.target_seconds))
        return [{"custom_id": f"{self.name}-{i}", "method": "POST", "url": ENDPOINT_CHAT,
                 "body": self.body(i)} for i in range(count)]

    def body(self, i: int) -> dict:
        return {"model": self.name, "max_tokens": self.max_tokens,
                "messages": [{"role": "user", "content": f"question {i:05d} about the tides"}]}


SCENARIOS = (
    Scenario("per-minute", rpm=6_000, tpm=9_000, burst_seconds=60, max_tokens=100,
             provider_refunds=False, reconcile=False, target_seconds=30),
    Scenario("reconciled", rpm=6_000, tpm=3_000, burst_seconds=60, max_tokens=400,
             provider_refunds=True, reconcile=True, target_seconds=30),
    Scenario("per-second", rpm=600, tpm=9_000, burst_seconds=1, max_tokens=100,
             provider_refunds=False, reconcile=False, target_seconds=30),
)

# One deployment, default settings (reconcile_usage = "auto"), the standard queue and
# 200 ms calls, at providers that do and do not give back unused max_tokens, per minute
# and per second. A request reserves 108 tokens and uses 21: given back, tokens allow
# about 48 requests a second and RPM binds at 20; kept, tokens bind at 9.3.
AUTO_SCENARIOS = tuple(
    Scenario(f"auto-{window}-{kind}", rpm=1_200, tpm=60_000, burst_seconds=burst,
             max_tokens=100, provider_refunds=kind == "refunds", target_seconds=20,
             queue="standard", latency_ms=200)
    for window, burst in (("minute", 60), ("second", 1)) for kind in ("keeps", "refunds"))

# A bulk job with and without 5% of its requests refused 429 at random (no rate-limit
# headers): an overloaded provider's 429 must cost bulk a pause, not its budget.
FAULT_SCENARIOS = (
    Scenario("bulk-clean", rpm=1_200, tpm=72_000, burst_seconds=60, max_tokens=50,
             provider_refunds=False, reconcile=False, target_seconds=30, queue="bulk"),
    Scenario("bulk-429s", rpm=1_200, tpm=72_000, burst_seconds=60, max_tokens=50,
             provider_refunds=False, reconcile=False, target_seconds=30, queue="bulk",
             fault_429=0.05),
)


@dataclass(frozen=True)
class Outcome:
    scenario: Scenario
    items: int
    status: str
    completed: int
    seconds: float
    rejected_429: int
    duplicate_bodies: int
    tokens_admitted: int
    tokens_kept: int
    requests_admitted: int
    faults_429: int = 0  # the provider's random refusals, not budget ones

    @property
    def utilisation(self) -> float:
        """What the provider kept over the most it could have admitted in the window, for
        its binding limit: tokens (net of refunds) or requests."""
        s = self.scenario
        return max(self.tokens_kept / (s.capacity + s.tpm / 60 * self.seconds),
                   self.requests_admitted / (s.request_capacity + s.rpm / 60 * self.seconds))

    @property
    def admitted_vs_ceiling(self) -> float:
        """Tokens admitted at estimate over the same bound: above 1 only thanks to refunds."""
        return self.tokens_admitted / (self.scenario.capacity
                                       + self.scenario.tpm / 60 * self.seconds)


class LimiterCluster:
    """Start the providers and workers once; run each scenario as one job."""

    def __init__(self, pg_url: str, redis_url: str, workdir: Path,
                 scenarios: tuple[Scenario, ...] | None = None,
                 limiter_url: str | None = None) -> None:
        """`redis_url` is the broker's; `limiter_url` (QUOTAFLOW_REDIS_URL) another Redis or
        a Redis Cluster for the budgets, else the broker's."""
        self.pg_url, self.redis_url, self.workdir = pg_url, redis_url, workdir
        self.limiter_url = limiter_url
        self.scenarios = SCENARIOS if scenarios is None else scenarios
        self.procs: list[Proc] = []
        self.providers: dict[str, str] = {}

    def __enter__(self) -> "LimiterCluster":
        flush_redis(self.redis_url)
        env = service_env()
        deployments = []
        try:
            for scenario in self.scenarios:
                port = free_port()
                faults = ["--fault", f"429={scenario.fault_429}"] if scenario.fault_429 else []
                self.providers[scenario.name] = f"http://127.0.0.1:{port}"
                self.procs.append(Proc(f"provider-{scenario.name}", quotaflow(
                    "mock-provider", "--port", str(port), "--rpm", str(scenario.rpm),
                    "--tpm", str(scenario.tpm), "--burst-seconds", str(scenario.burst_seconds),
                    "--latency-ms", str(scenario.latency_ms),
                    "--reconcile" if scenario.provider_refunds else "--no-reconcile", *faults),
                    env, self.workdir))
                reconcile = ("" if scenario.reconcile is None else
                             f"reconcile_usage = {str(scenario.reconcile).lower()}\n")
                deployments.append(
                    f'[deployments.{scenario.name}]\nprovider = "openai"\n'
                    f'base_url = "http://127.0.0.1:{port}/v1"\nmodel = "{scenario.name}"\n'
                    f"rpm = {scenario.rpm}\ntpm = {scenario.tpm}\n"
                    f"burst_seconds = {scenario.burst_seconds}\n{reconcile}")
            self.deployments_file = self.workdir / "deployments.toml"
            self.deployments_file.write_text("\n".join(deployments))
            self.env = {**env, "QUOTAFLOW_DATABASE_URL": self.pg_url,
                        "QUOTAFLOW_BROKER_URL": self.redis_url,
                        "QUOTAFLOW_DEPLOYMENTS_FILE": str(self.deployments_file),
                        **({"QUOTAFLOW_REDIS_URL": self.limiter_url} if self.limiter_url else {})}
            workers = [Proc(f"worker{n}", quotaflow(
                "worker", "--queues", "realtime,standard,bulk", "--concurrency", str(CONCURRENCY),
                "--name", f"limiter{n}@qftest"), self.env, self.workdir) for n in range(WORKERS)]
            self.procs += workers
            for proc in self.procs[:len(self.scenarios)]:
                name = proc.name.removeprefix("provider-")
                proc.wait_http(f"{self.providers[name]}/healthz")
            for worker in workers:
                worker.wait_until(lambda w=worker: " ready." in w.log())
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        for proc in reversed(self.procs):
            proc.stop()

    def run(self, scenario: Scenario, timeout: float = 240) -> Outcome:
        return self.wait(scenario, self.submit(scenario), timeout)

    def submit(self, scenario: Scenario) -> str:
        """Queue the scenario's job; its id."""
        settings = Settings(database_url=self.pg_url, broker_url=self.redis_url,
                            deployments_file=self.deployments_file, batch_size=5,
                            largest_batch_size=5, _env_file=None)  # small, none growing
        data = "".join(json.dumps(line) + "\n" for line in scenario.lines()).encode()
        return pipeline.create_job_in_process(
            session_factory(self.pg_url), io.BytesIO(data), settings=settings,
            deployments=settings.load_deployments(), dispatcher=CeleryDispatcher(self.redis_url),
            queue=scenario.queue).id

    def admitted(self, scenario: Scenario) -> int:
        """Requests the scenario's provider has admitted so far."""
        return httpx.get(f"{self.providers[scenario.name]}/stats").json()["admitted"]

    def wait(self, scenario: Scenario, job_id: str, timeout: float = 240) -> Outcome:
        """Wait for the job to end; the provider's figures for it."""
        sessions = session_factory(self.pg_url)
        lines = scenario.lines()
        deadline = time.monotonic() + timeout
        while True:
            with sessions() as session:
                view = job_view.job_object(session, jobs.get_job(session, job_id))
            if view["status"] not in ("in_progress", "validating"):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{scenario.name}: {view['request_counts']}")
            time.sleep(0.5)
        stats = httpx.get(f"{self.providers[scenario.name]}/stats").json()
        return Outcome(
            scenario=scenario, items=len(lines), status=view["status"],
            completed=view["request_counts"]["completed"],
            seconds=stats["last_admitted_at"] - stats["first_admitted_at"],
            rejected_429=stats["rejected_429"], duplicate_bodies=stats["duplicate_bodies"],
            tokens_admitted=stats["tokens_admitted"],
            tokens_kept=stats["tokens_admitted"] - stats["tokens_refunded"],
            requests_admitted=stats["admitted"],
            faults_429=stats.get("faults", {}).get("429", 0))

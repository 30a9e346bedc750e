"""Celery workers sharing anthropic deployments at strict mocks of the Messages API, each
scenario binding a different one of Anthropic's three limits (RPM, ITPM, OTPM).

Used by tests/cluster/test_anthropic_cluster.py. utilisation = the binding limit's share, as
tests/harness/limiter_cluster.py counts it: what the provider kept of requests, input tokens or
output tokens (net of refunds) over capacity + limit x minutes from its first
admission to its last, whichever is highest.
"""

import io
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from quotaflow.budget.tokens import estimate_tokens
from quotaflow.config import Settings
from quotaflow.constants import ENDPOINT_CHAT
from quotaflow.db import session_factory
from quotaflow.ingest import pipeline
from quotaflow.jobs import service as jobs
from quotaflow.jobs import view as job_view
from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import flush_redis, service_env
from workers.dispatch import CeleryDispatcher

WORKERS = 3
CONCURRENCY = 2
LATENCY_MS = 20
BURST_S = 5.0
OUTPUT_USED = estimate_tokens("simulated reply to: question 00000 about the tides")


@dataclass(frozen=True)
class Scenario:
    name: str
    rpm: int
    itpm: int
    otpm: int
    max_tokens: int
    padding: int  # characters added to each prompt: its input tokens
    target_seconds: float = 10.0
    # A deployment that ignores ITPM/OTPM: one tpm of itpm + otpm, input and output
    # counted together, the way an OpenAI-style limiter would.
    naive: bool = False

    def body(self, i: int) -> dict:
        # The padding goes in the system prompt: the mock's reply repeats the user's text.
        messages = [{"role": "user", "content": f"question {i:05d} about the tides"}]
        if self.padding:
            messages.insert(0, {"role": "system", "content": "." * self.padding})
        return {"model": self.name, "max_tokens": self.max_tokens, "messages": messages}

    @property
    def input_tokens(self) -> int:
        return estimate_tokens("\n".join(m["content"] for m in self.body(0)["messages"]))

    def per_second(self) -> float:
        """Requests a second the binding limit allows (the provider refunds output)."""
        return min(self.rpm / 60, self.itpm / 60 / self.input_tokens,
                   self.otpm / 60 / OUTPUT_USED)

    def lines(self) -> list[dict]:
        burst = min(self.rpm, self.itpm / self.input_tokens, self.otpm / self.max_tokens)
        count = math.ceil(burst * BURST_S / 60 + self.per_second() * self.target_seconds)
        return [{"custom_id": f"{self.name}-{i}", "method": "POST", "url": ENDPOINT_CHAT,
                 "body": self.body(i)} for i in range(count)]

    def deployment(self, port: int) -> str:
        limits = (f"tpm = {self.itpm + self.otpm}" if self.naive
                  else f"itpm = {self.itpm}\notpm = {self.otpm}")
        return (f'[deployments.{self.name}]\nprovider = "anthropic"\n'
                f'base_url = "http://127.0.0.1:{port}"\nmodel = "{self.name}"\n'
                f'api_key_env = "QF_TEST_ANTHROPIC_KEY"\nrpm = {self.rpm}\n{limits}\n'
                f"burst_seconds = {BURST_S}\nreconcile_usage = true\n")


SCENARIOS = (
    # 10 requests a second allowed; input and output would allow 100 and 77.
    Scenario("binds-rpm", rpm=600, itpm=60_000, otpm=60_000, max_tokens=50, padding=0),
    # ~53 input tokens a request: 19 a second; requests and output would allow 100 and 77.
    Scenario("binds-itpm", rpm=6_000, itpm=60_000, otpm=60_000, max_tokens=50, padding=180),
    # 13 output tokens used of 100 reserved: 20 a second; the others allow 100 and 125.
    Scenario("binds-otpm", rpm=6_000, itpm=60_000, otpm=15_600, max_tokens=100, padding=0),
    # ITPM binds as in binds-itpm, but the deployment counts one combined tpm.
    Scenario("naive-itpm", rpm=6_000, itpm=60_000, otpm=60_000, max_tokens=50, padding=180,
             naive=True),
)


@dataclass(frozen=True)
class Outcome:
    scenario: Scenario
    items: int
    status: str
    completed: int
    seconds: float
    rejected_429: int
    limited_by: dict[str, int]
    duplicate_bodies: int
    requests: int
    input_tokens: int
    output_kept: int

    def shares(self) -> dict[str, float]:
        s, t = self.scenario, self.seconds
        return {"requests": self.requests / (s.rpm * (BURST_S + t) / 60),
                "input-tokens": self.input_tokens / (s.itpm * (BURST_S + t) / 60),
                "output-tokens": self.output_kept / (s.otpm * (BURST_S + t) / 60)}

    @property
    def binding(self) -> str:
        shares = self.shares()
        return max(shares, key=lambda name: shares[name])

    @property
    def utilisation(self) -> float:
        return self.shares()[self.binding]


class AnthropicCluster:
    """One strict mock per scenario, the workers started once; each scenario one job."""

    def __init__(self, pg_url: str, redis_url: str, workdir: Path,
                 scenarios: tuple[Scenario, ...] = SCENARIOS) -> None:
        self.pg_url, self.redis_url, self.workdir = pg_url, redis_url, workdir
        self.scenarios = scenarios
        self.procs: list[Proc] = []
        self.providers: dict[str, str] = {}

    def __enter__(self) -> "AnthropicCluster":
        flush_redis(self.redis_url)
        env = service_env(QF_TEST_ANTHROPIC_KEY="sk-ant-test")
        deployments = []
        try:
            for s in self.scenarios:
                port = free_port()
                self.providers[s.name] = f"http://127.0.0.1:{port}"
                self.procs.append(Proc(f"provider-{s.name}", quotaflow(
                    "mock-provider", "--port", str(port), "--rpm", str(s.rpm), "--tpm", "1",
                    "--itpm", str(s.itpm), "--otpm", str(s.otpm), "--burst-seconds",
                    str(BURST_S), "--latency-ms", str(LATENCY_MS), "--reconcile",
                    "--api-key-env", "QF_TEST_ANTHROPIC_KEY"), env, self.workdir))
                deployments.append(s.deployment(port))
            self.deployments_file = self.workdir / "deployments.toml"
            self.deployments_file.write_text("\n".join(deployments))
            self.env = {**env, "QUOTAFLOW_DATABASE_URL": self.pg_url,
                        "QUOTAFLOW_BROKER_URL": self.redis_url,
                        "QUOTAFLOW_DEPLOYMENTS_FILE": str(self.deployments_file)}
            workers = [Proc(f"worker{n}", quotaflow(
                "worker", "--queues", "realtime,standard,bulk", "--concurrency", str(CONCURRENCY),
                "--name", f"anthropic{n}@qftest"), self.env, self.workdir)
                for n in range(WORKERS)]
            self.procs += workers
            for name, url in self.providers.items():
                next(p for p in self.procs if p.name == f"provider-{name}").wait_http(
                    f"{url}/healthz")
            for worker in workers:
                worker.wait_until(lambda w=worker: " ready." in w.log())
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        for proc in reversed(self.procs):
            proc.stop()

    def run(self, scenario: Scenario, timeout: float = 120) -> Outcome:
        settings = Settings(database_url=self.pg_url, broker_url=self.redis_url,
                            deployments_file=self.deployments_file, batch_size=5,
                            largest_batch_size=5, _env_file=None)  # small, none growing
        sessions = session_factory(self.pg_url)
        lines = scenario.lines()
        data = "".join(json.dumps(line) + "\n" for line in lines).encode()
        job = pipeline.create_job_in_process(
            sessions, io.BytesIO(data), settings=settings, deployments=settings.load_deployments(),
            dispatcher=CeleryDispatcher(self.redis_url), queue="realtime")
        deadline = time.monotonic() + timeout
        while True:
            with sessions() as session:
                view = job_view.job_object(session, jobs.get_job(session, job.id))
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
            rejected_429=stats["rejected_429"], limited_by=stats["limited_by"],
            duplicate_bodies=stats["duplicate_bodies"], requests=stats["admitted"],
            input_tokens=stats["input_tokens_admitted"],
            output_kept=stats["output_tokens_admitted"] - stats["tokens_refunded"])

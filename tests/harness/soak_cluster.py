"""The limiter's soak: real workers, run after run, against a strict mock provider under
adversity (issue 28): providers that keep or give back reservations, per-minute and
per-second windows, jittered latency, workers starved of CPU, a second client on the
same key, Redis flushed or restarted empty mid-run, 429s the budget did not cause.

Four workers (two processes each) start once, on a Redis of the soak's own (it may be
flushed and restarted); every run gets a deployment of its own and a fresh provider,
so each starts from full buckets on both sides. Used by bench/limiter_soak.py (the
table) and tests/cluster/test_limiter_soak.py (its short form).
"""

import io
import json
import math
import random
import statistics
import subprocess
import sys
import threading
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
from tests.harness.chaos_cluster import OwnRedis
from tests.harness.procs import Proc, quiet_port, quotaflow
from tests.harness.servers import flush_redis, service_env
from workers.dispatch import CeleryDispatcher

WORKERS, CONCURRENCY, MAX_CONCURRENCY = 4, 2, 16
MAX_TOKENS = 100
FLOOR = Settings.model_fields["floor_standard"].default


@dataclass(frozen=True)
class Soak:
    """One scenario; `other` is the share of the key a second client spends, drawn per run
    between its two bounds."""

    name: str
    burst_s: float = 60.0
    tpm: int = 60_000
    refunds: bool = False
    latency_ms: int = 200
    jitter_ms: int = 0
    busy_loops: int = 0
    other: tuple[float, float] = (0.0, 0.0)
    redis: str = ""  # "flush" or "restart" at 40% done
    fault_429: float = 0.0
    seconds: float = 15.0
    rpm: int = 6_000

    @property
    def capacity(self) -> float:
        """The tokens a standard job may take at once (its queue's floor left out)."""
        return self.tpm * self.burst_s / 60 * (1 - FLOOR)

    @property
    def request_capacity(self) -> float:
        return self.rpm * self.burst_s / 60 * (1 - FLOOR)


SCENARIOS = (
    Soak("keeps-minute"),
    Soak("refunds-minute", refunds=True),
    Soak("keeps-second", burst_s=1.0, tpm=30_000),
    # Given back, a request keeps 21 of its 108 tokens: RPM binds, as it would.
    Soak("refunds-second", burst_s=1.0, rpm=1_200, refunds=True),
    Soak("jitter-0-500ms", latency_ms=0, jitter_ms=500),
    Soak("starved-cpu", busy_loops=3),
    Soak("shared-key", other=(0.2, 0.5)),
    Soak("redis-flushed", redis="flush", seconds=25.0),
    Soak("redis-restarted", redis="restart", seconds=25.0),
    Soak("random-429s", fault_429=0.05),
)


@dataclass(frozen=True)
class Run:
    soak: Soak
    items: int
    completed: int
    rejected_429: int  # quotaflow's calls the provider refused for its budget
    repeats: int
    # quotaflow's kept tokens (or requests, whichever binds) over what the provider left it
    utilisation: float
    other_429: int = 0

    @property
    def lost(self) -> int:
        return self.items - self.completed


class SoakCluster:
    def __init__(self, pg_url: str, workdir: Path, scenarios: tuple[Soak, ...],
                 runs: int) -> None:
        self.pg_url, self.workdir, self.runs = pg_url, workdir, runs
        self.scenarios = scenarios
        self.redis = OwnRedis(workdir, aof=False)
        self.ports: dict[str, int] = {}
        self.procs: list[Proc] = []

    def names(self) -> list[tuple[Soak, str]]:
        return [(s, f"{s.name}-{n}") for s in self.scenarios for n in range(self.runs)]

    def __enter__(self) -> "SoakCluster":
        self.redis.start()
        entries = []
        for soak, name in self.names():
            self.ports[name] = quiet_port()
            entries.append(f'[deployments.{name}]\nprovider = "openai"\n'
                           f'base_url = "http://127.0.0.1:{self.ports[name]}/v1"\n'
                           f'model = "{name}"\nrpm = {soak.rpm}\ntpm = {soak.tpm}\n'
                           f"burst_seconds = {soak.burst_s}\n")
        self.deployments = self.workdir / "soak-deployments.toml"
        self.deployments.write_text("\n".join(entries))
        self.env = service_env(QUOTAFLOW_DATABASE_URL=self.pg_url,
                               QUOTAFLOW_BROKER_URL=self.redis.url,
                               QUOTAFLOW_DEPLOYMENTS_FILE=str(self.deployments),
                               QUOTAFLOW_REAP_INTERVAL_S="2")
        try:
            workers = [Proc(f"soak-worker{n}", quotaflow(
                "worker", "--queues", "realtime,standard,bulk", "--concurrency",
                str(CONCURRENCY), "--name", f"soak{n}@qftest"), self.env, self.workdir)
                for n in range(WORKERS)]
            self.procs += workers
            for worker in workers:
                worker.wait_until(lambda w=worker: " ready." in w.log(), timeout=120)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        for proc in reversed(self.procs):
            proc.stop()
        self.redis.stop()

    def run_all(self) -> list[Run]:
        return [self.run(soak, name) for soak, name in self.names()]

    def run(self, soak: Soak, name: str, timeout: float = 180) -> Run:
        port = self.ports[name]
        url = f"http://127.0.0.1:{port}"
        options = ["--port", str(port), "--rpm", str(soak.rpm), "--tpm", str(soak.tpm),
                   "--burst-seconds", str(soak.burst_s), "--latency-ms", str(soak.latency_ms),
                   "--reconcile" if soak.refunds else "--no-reconcile"]
        if soak.fault_429:
            options += ["--fault", f"429={soak.fault_429}"]
        provider = Proc(f"provider-{name}", quotaflow("mock-provider", *options),
                        service_env(QUOTAFLOW_MOCK_LATENCY_JITTER_MS=str(soak.jitter_ms)),
                        self.workdir)
        busy: list[subprocess.Popen] = []
        other = _OtherClient(url, name, soak) if soak.other[1] else None
        try:
            provider.wait_http(f"{url}/healthz")
            busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                    for _ in range(soak.busy_loops)]
            if other is not None:
                other.start()
            items = self._job(soak, name, timeout)
        finally:
            if other is not None:
                other.stop()
            for loop in busy:
                loop.kill()
                loop.wait()
        try:
            stats = httpx.get(f"{url}/stats", timeout=10).json()
        finally:
            provider.stop()
        return self._outcome(soak, items, stats, other)

    def _job(self, soak: Soak, name: str, timeout: float) -> tuple[int, int]:
        settings = Settings(database_url=self.pg_url, broker_url=self.redis.url,
                            deployments_file=self.deployments, _env_file=None)
        sessions = session_factory(self.pg_url)
        lines = _lines(soak, name)
        job = pipeline.create_job_in_process(
            sessions, io.BytesIO("".join(json.dumps(line) + "\n" for line in lines).encode()),
            settings=settings, deployments=settings.load_deployments(),
            dispatcher=CeleryDispatcher(self.redis.url), queue="standard")
        deadline, faulted = time.monotonic() + timeout, not soak.redis
        while True:
            with sessions() as session:
                view = job_view.job_object(session, jobs.get_job(session, job.id))
            if view["status"] not in ("in_progress", "validating"):
                break
            if not faulted and view["request_counts"]["completed"] >= 0.4 * len(lines):
                faulted = True
                self._fault(soak.redis)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: {view['request_counts']}")
            time.sleep(0.25)
        sessions.kw["bind"].dispose()
        return len(lines), view["request_counts"]["completed"]

    def _fault(self, kind: str) -> None:
        if kind == "flush":
            flush_redis(self.redis.url)
        else:
            assert self.redis.popen is not None
            self.redis.popen.kill()  # no persistence: it comes back empty
            self.redis.popen.wait()
            self.redis.start()

    @staticmethod
    def _outcome(soak: Soak, counts: tuple[int, int], stats: dict,
                 other: "_OtherClient | None") -> Run:
        items, completed = counts
        other_kept = other.kept if other else 0
        other_sent = other.admitted if other else 0
        other_429 = other.rejected if other else 0
        window = stats["last_admitted_at"] - stats["first_admitted_at"]
        kept = stats["tokens_admitted"] - stats["tokens_refunded"] - other_kept
        tokens = kept / (soak.capacity + soak.tpm / 60 * window - other_kept)
        requests = (stats["admitted"] - other_sent) / (
            soak.request_capacity + soak.rpm / 60 * window - other_sent)
        return Run(soak, items, completed, stats["rejected_429"] - other_429,
                   stats["duplicate_bodies"], max(tokens, requests), other_429)


class _OtherClient:
    """Someone else on the same key: requests straight to the provider at a random share
    of its TPM, drawn per run."""

    def __init__(self, url: str, name: str, soak: Soak) -> None:
        self.url, self.name = url, name
        self.share = random.uniform(*soak.other)
        self.cost = admission_tokens(ENDPOINT_CHAT, _body(name, "other 0"), 0)
        self.used = simulated_body(ENDPOINT_CHAT, _body(name, "other 0"))["usage"]["total_tokens"]
        self.refunds = soak.refunds
        self.rate = self.share * soak.tpm / 60 / (self.used if soak.refunds else self.cost)
        self.kept = self.rejected = self.admitted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _loop(self) -> None:
        n = 0
        with httpx.Client(base_url=self.url, timeout=30) as client:
            started = time.monotonic()
            while not self._stop.is_set():
                due = started + n / self.rate
                if (wait := due - time.monotonic()) > 0:
                    self._stop.wait(wait)
                    continue
                answer = client.post("/v1/chat/completions",
                                     json=_body(self.name, f"other {n:06d}"))
                n += 1
                if answer.status_code == 429:
                    self.rejected += 1
                elif answer.status_code == 200:
                    self.admitted += 1
                    self.kept += self.used if self.refunds else self.cost


def _body(name: str, prompt: str) -> dict:
    return {"model": name, "max_tokens": MAX_TOKENS,
            "messages": [{"role": "user", "content": prompt}]}


def _lines(soak: Soak, name: str) -> list[dict]:
    """Enough requests to keep the budget busy for about `soak.seconds`."""
    sample = _body(name, "question 00000 about the tides")
    cost = admission_tokens(ENDPOINT_CHAT, sample, 0)
    used = simulated_body(ENDPOINT_CHAT, sample)["usage"]["total_tokens"]
    per_item = used if soak.refunds else cost
    share = 1 - soak.other[1]
    count = math.ceil(min((soak.capacity + soak.tpm / 60 * soak.seconds * share) / per_item,
                          soak.request_capacity + soak.rpm / 60 * soak.seconds * share))
    return [{"custom_id": f"{name}-{i}", "method": "POST", "url": ENDPOINT_CHAT,
             "body": _body(name, f"question {i:05d} about the tides")} for i in range(count)]


HEADER = ("scenario", "runs", "429s total", "429s worst run", "utilisation min",
          "utilisation median", "repeats", "lost")


def table(results: list[Run]) -> str:
    """One row per scenario, in the order first run."""
    rows = [HEADER]
    for name in dict.fromkeys(run.soak.name for run in results):
        runs = [run for run in results if run.soak.name == name]
        shares = [run.utilisation for run in runs]
        rows.append((name, str(len(runs)), str(sum(r.rejected_429 for r in runs)),
                     str(max(r.rejected_429 for r in runs)), f"{min(shares):.3f}",
                     f"{statistics.median(shares):.3f}", str(sum(r.repeats for r in runs)),
                     str(sum(r.lost for r in runs))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |"
             for row in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)

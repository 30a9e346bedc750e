"""Caps inside the shared budget: the cluster, the submissions and the counts that
tests/cluster/test_caps_cluster.py asserts on.

Four strict mock providers, one per mode that matters (they give back unused max_tokens
or keep them; their budget refills per minute or per second), each one deployment of
300 RPM; four workers of two slots. Tenant "capped" (--rpm CAP_RPM) and tenant "free"
(no cap) each submit a bulk job with lines for all four deployments in turn (each
deployment has work from the start: a batch runs its routes side by side). Who sent
what, and when, is read from each provider's own record of the requests it received
(--record), not from quotaflow.
"""

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from quotaflow.db import session_factory
from quotaflow.tenants import keys as auth
from tests.harness.cluster import start_provider
from tests.harness.factories import chat_line, jsonl
from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import service_env

RPM = 300
CAP_RPM = 60
WORKERS = 4
# name -> (burst seconds, the provider gives back unused max_tokens)
MODES = {"minute-refund": (60.0, True), "minute-keep": (60.0, False),
         "second-refund": (1.0, True), "second-keep": (1.0, False)}
LINES_PER_MODE = 200


@dataclass
class CapCluster:
    """The providers, the API and the workers, on the caller's PostgreSQL and Redis db
    (flushed by the caller). `capped`: give tenant "capped" its cap (False: the proof's
    counter-check, which must then fail)."""

    tmp_path: Path
    pg_url: str
    redis_url: str
    capped: bool = True
    procs: list[Proc] = field(default_factory=list)
    providers: dict[str, str] = field(default_factory=dict)
    api_url: str = ""

    def start(self) -> None:
        blocks = []
        for name, (burst, refunds) in MODES.items():
            (self.tmp_path / name).mkdir(exist_ok=True)
            proc, url = start_provider(
                self.tmp_path / name, "--rpm", str(RPM), "--tpm", "100000000",
                "--burst-seconds", f"{burst:g}", "--latency-ms", "100",
                "--reconcile" if refunds else "--no-reconcile",
                "--record", str(self.tmp_path / f"{name}.jsonl"))
            self.procs.append(proc)
            self.providers[name] = url
            blocks.append(f'[deployments.{name}]\nprovider = "openai"\n'
                          f'base_url = "{url}/v1"\nmodel = "{name}"\nrpm = {RPM}\n'
                          f'tpm = 100000000\nburst_seconds = {burst:g}\n'
                          f'reconcile_usage = {str(refunds).lower()}\n')
        routes = "".join(f'"{name}" = "{name}"\n' for name in MODES)
        deployments = self.tmp_path / "deployments.toml"
        deployments.write_text("".join(blocks) + "[routes]\n" + routes)
        env = service_env(QUOTAFLOW_DATABASE_URL=self.pg_url, QUOTAFLOW_BROKER_URL=self.redis_url,
                          QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments))
        port = free_port()
        api = Proc("api", quotaflow("api", "--port", str(port)), env, self.tmp_path)
        self.procs.append(api)
        self.api_url = f"http://127.0.0.1:{port}"
        api.wait_http(f"{self.api_url}/healthz")
        workers = [Proc(f"worker{n}", quotaflow("worker", "--queues", "standard,bulk",
                                                "--concurrency", "2",
                                                "--name", f"caps{n}@qftest"),
                        env, self.tmp_path)
                   for n in range(WORKERS)]
        for worker in workers:
            worker.wait_until(lambda w=worker: " ready." in w.log())
        self.procs += workers

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop()

    def run(self, measure_s: float) -> None:
        """Submit the three jobs at once, let them run measure_s, cancel what is left."""
        sessions = session_factory(self.pg_url)
        capped = auth.create_key(sessions, "capped", max_rpm=CAP_RPM if self.capped else None)
        free = auth.create_key(sessions, "free")
        sessions.kw["bind"].dispose()
        made = [(capped.secret, self._submit(capped.secret, "capped", {})),
                (free.secret, self._submit(free.secret, "free", {}))]
        time.sleep(measure_s)
        for key, job_id in made:
            httpx.post(f"{self.api_url}/jobs/{job_id}/cancel", timeout=30,
                       headers={"Authorization": f"Bearer {key}"})
        time.sleep(1.0)

    def _submit(self, key: str, tag: str, options: dict[str, str]) -> str:
        lines = [chat_line(f"{tag}-{name}-{i}", prompt=f"{tag} question {i}", model=name)
                 for i in range(LINES_PER_MODE) for name in MODES]
        answer = httpx.post(f"{self.api_url}/jobs", files={"file": ("f.jsonl", jsonl(lines))},
                            data={"queue": "bulk", **options}, timeout=60,
                            headers={"Authorization": f"Bearer {key}"})
        assert answer.status_code == 201, answer.text
        return str(answer.json()["id"])

    def received(self, mode: str) -> dict[str, list[float]]:
        """Per tag ("capped", "free"): when the provider received its requests."""
        return received(self.tmp_path / f"{mode}.jsonl")

    def rejected_429(self, mode: str) -> int:
        stats = httpx.get(f"{self.providers[mode]}/stats", timeout=10).json()
        return int(stats["rejected_429"])


def received(record: Path) -> dict[str, list[float]]:
    """Per tag (a prompt's first word): when a provider's --record says it received them."""
    seen: dict[str, list[float]] = {}
    for line in record.read_text().splitlines():
        body = json.loads(line)
        tag = body["body"]["messages"][0]["content"].split()[0]
        seen.setdefault(tag, []).append(body["at"])
    return {tag: sorted(times) for tag, times in seen.items()}


def most_in_a_window(times: list[float], window_s: float) -> int:
    """The most requests received in any window of window_s (sliding, from each one)."""
    most, first = 0, 0
    for last, at in enumerate(times):
        while times[first] < at - window_s + 1e-9:
            first += 1
        most = max(most, last - first + 1)
    return most


def bound(rpm: float, burst_s: float, window_s: float) -> float:
    """What a token bucket of rpm (capacity rpm x burst / 60, one at least) admits in
    window_s at most."""
    return max(1.0, rpm * burst_s / 60) + rpm / 60 * window_s

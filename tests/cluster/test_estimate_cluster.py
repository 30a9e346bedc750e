"""`quotaflow estimate` against a real run: the real API process, two Celery worker
processes and strict mock providers that keep every reservation (no refunds), so the
job's time is set by its budget alone.

Two deployments, each given one job of ~15 s through `quotaflow estimate --json` and
then `quotaflow submit` on the realtime queue (floor 0, so the whole bucket is the
job's; a standard or bulk job leaves 5% / 20% of it, which the estimate counts too):

- `steady`: 120 RPM over a minute, TPM ample. 150 requests: 119.5 of them fit the
  full bucket at once, the rest come 2 a second, so the last is admitted after 15.25 s;
  an estimate that ignored the full bucket would say 75 s.
- `digits`: gpt-4o-mini, 42,000 TPM enforced per second (burst 1 s), RPM ample. Its
  prompts are digit strings, which o200k_base splits three digits a token: the
  tokenizer counts ~34% more prompt tokens than the characters / 4 the limiter and
  the provider admit by, so a time computed from the tokenizer's count is ~34% long.

The time is checked within 10% of the run's wall time from the first admission to the
last answer (the results' provenance). The mock provider reports usage at characters / 4
(quotaflow.providers.mock): the estimate's admission count must equal it exactly, and
for the chars/4 route so must its prompt count; the o200k count of the digits route is
checked against bpe-openai directly and against the provider's figure by the ratio digit
strings have (1.25 .. 1.45), since the mock has no tokenizer to agree with.
"""

import json
import random
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from quotaflow.db import get_engine
from quotaflow.ingest.tokenizers import counter_for
from tests.harness.factories import chat_line, jsonl
from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import REDIS_URL, ROOT, flush_redis, service_env

LATENCY_MS = 20
ENQUEUED_LIMIT = 1_000_000
SPEND_LIMIT = 5.0


@dataclass
class Cluster:
    env: dict[str, str]
    api_url: str
    providers: dict[str, str]
    workdir: Path
    pg_url: str

    def cli(self, *args: str) -> str:
        done = subprocess.run(quotaflow(*args), env=self.env, capture_output=True, text=True,
                              timeout=120, cwd=self.workdir)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def count(self, table: str) -> int:
        with get_engine(self.pg_url).connect() as conn:
            return conn.scalar(text(f"SELECT count(*) FROM {table}"))


@pytest.fixture(scope="module")
def cluster(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("estimate")
    flush_redis(REDIS_URL)
    limits = {"steady": ("120", "1000000", "60"), "digits": ("6000", "42000", "1")}
    ports = {name: free_port() for name in (*limits, "api")}
    deployments = workdir / "deployments.toml"
    deployments.write_text(f"""
[deployments.steady]
provider = "openai"
base_url = "http://127.0.0.1:{ports['steady']}/v1"
model = "steady-model"
rpm = 120
tpm = 1000000
reconcile_usage = false
input_per_mtok = 1.0
output_per_mtok = 2.0

[deployments.digits]
provider = "openai"
base_url = "http://127.0.0.1:{ports['digits']}/v1"
model = "gpt-4o-mini"
rpm = 6000
tpm = 42000
burst_seconds = 1
reconcile_usage = false
input_per_mtok = 0.15
output_per_mtok = 0.6
""")
    env = service_env(PYTHONPATH=str(ROOT), QUOTAFLOW_DATABASE_URL=pg_url,
                      QUOTAFLOW_BROKER_URL=REDIS_URL, QUOTAFLOW_AUTH="false",
                      QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments),
                      QUOTAFLOW_API_URL=f"http://127.0.0.1:{ports['api']}",
                      QUOTAFLOW_MAX_ENQUEUED_TOKENS=str(ENQUEUED_LIMIT),
                      QUOTAFLOW_MAX_MONTHLY_SPEND=str(SPEND_LIMIT))
    procs: list[Proc] = []
    try:
        for name, (rpm, tpm, burst) in limits.items():
            procs.append(Proc(name, quotaflow(
                "mock-provider", "--port", str(ports[name]), "--rpm", rpm, "--tpm", tpm,
                "--burst-seconds", burst, "--latency-ms", str(LATENCY_MS), "--no-reconcile"),
                env, workdir))
        procs.append(Proc("api", quotaflow("api", "--port", str(ports["api"])), env, workdir))
        workers = [Proc(f"worker{n}", quotaflow(
            "worker", "--queues", "realtime,standard,bulk", "--concurrency", "2",
            "--name", f"estimate{n}@qftest"), env, workdir) for n in (1, 2)]
        procs += workers
        for name in limits:
            procs[0].wait_http(f"http://127.0.0.1:{ports[name]}/healthz")
        procs[2].wait_http(f"http://127.0.0.1:{ports['api']}/healthz")
        for worker in workers:
            worker.wait_until(lambda w=worker: " ready." in w.log())
        yield Cluster(env, f"http://127.0.0.1:{ports['api']}",
                      {name: f"http://127.0.0.1:{ports[name]}" for name in limits},
                      workdir, pg_url)
    finally:
        for proc in reversed(procs):
            proc.stop()


def steady_lines() -> list[dict]:
    return [chat_line(f"s-{i}", f"question {i:04d} about the tides", model="steady-model",
                      max_tokens=20) for i in range(150)]


def digits_lines() -> list[dict]:
    draw = random.Random(16)
    return [chat_line(f"d-{i}", f"{i:04d}" + "".join(draw.choices("0123456789", k=396)),
                      model="gpt-4o-mini", max_tokens=5) for i in range(105)]


@dataclass
class Run:
    estimate: dict
    route: dict
    seconds: float  # first admission to last answer
    stats: dict  # the provider's


def estimate_then_run(cluster: Cluster, name: str, lines: list[dict]) -> Run:
    path = cluster.workdir / f"{name}.jsonl"
    path.write_bytes(jsonl(lines))
    found = json.loads(cluster.cli("estimate", str(path), "--queue", "realtime", "--json"))
    job_id = cluster.cli("submit", str(path), "--queue", "realtime").strip()
    deadline = time.monotonic() + 90
    with get_engine(cluster.pg_url).connect() as conn:
        while conn.scalar(text("SELECT status FROM jobs WHERE id = :id"),
                          {"id": job_id}) in ("validating", "in_progress"):
            assert time.monotonic() < deadline, f"{name} did not finish"
            time.sleep(0.3)
            conn.rollback()
        first, last, done = conn.execute(text(
            "SELECT min(admitted_at), max(answered_at), count(*) FILTER (WHERE error IS NULL) "
            "FROM results WHERE job_id = :id"), {"id": job_id}).one()
    assert done == len(lines)
    stats = httpx.get(f"{cluster.providers[name]}/stats").json()
    [route] = found["routes"]
    return Run(found, route, (last - first).total_seconds(), stats)


def test_rpm_bound_estimate_matches_the_run(cluster: Cluster) -> None:
    lines = steady_lines()
    run = estimate_then_run(cluster, "steady", lines)
    route, stats = run.route, run.stats
    assert route["deployments"] == ["steady"] and route["tokenizer"] == "chars/4"
    # the same counter as the provider's: exact
    assert route["prompt_tokens"] == route["admission_prompt_tokens"] == stats["prompt_tokens"]
    assert route["max_completion_tokens"] == 20 * len(lines)
    assert stats["tokens_admitted"] - stats["prompt_tokens"] == route["max_completion_tokens"]
    assert stats["completion_tokens"] <= route["max_completion_tokens"]
    assert stats["rejected_429"] == 0
    time_ = route["time"]
    print(f"\nsteady (RPM-bound): estimate {time_['seconds']:.2f} s, run {run.seconds:.2f} s")
    assert abs(time_["seconds"] - run.seconds) <= 0.10 * run.seconds, (time_, run.seconds)
    assert time_["binding"] == "rpm" and time_["seconds"] == pytest.approx(15.25)
    assert run.estimate["totals"]["seconds"] == time_["seconds"]
    # the tenant's limits, as the server has them
    tenant = run.estimate["tenant"]
    assert tenant["enqueued_tokens"]["limit"] == ENQUEUED_LIMIT
    assert tenant["enqueued_tokens"]["this_file"] == stats["prompt_tokens"]
    assert tenant["monthly_spend"]["limit"] == SPEND_LIMIT
    cost = route["cost"]
    assert cost["low"] == pytest.approx(stats["prompt_tokens"] * 1.0 / 1e6, abs=1e-6)
    assert cost["high"] == pytest.approx(cost["low"] + 3000 * 2.0 / 1e6, abs=1e-6)


def test_tpm_bound_estimate_times_by_admission_tokens(cluster: Cluster) -> None:
    lines = digits_lines()
    run = estimate_then_run(cluster, "digits", lines)
    route, stats = run.route, run.stats
    assert route["tokenizer"] == "o200k_base"
    # what the limiter and the provider admit by: exact
    assert route["admission_prompt_tokens"] == stats["prompt_tokens"]
    assert route["max_completion_tokens"] == 5 * len(lines)
    assert stats["tokens_admitted"] == route["admission_tokens"]
    assert stats["rejected_429"] == 0
    # what the model counts: bpe-openai's own count, and the ratio digits have
    o200k = counter_for("gpt-4o")
    assert route["prompt_tokens"] == sum(
        o200k.count(line["body"]["messages"][0]["content"]) for line in lines)
    assert 1.25 <= route["prompt_tokens"] / stats["prompt_tokens"] <= 1.45
    time_ = route["time"]
    print(f"\ndigits (TPM-bound): estimate {time_['seconds']:.2f} s, run {run.seconds:.2f} s")
    assert abs(time_["seconds"] - run.seconds) <= 0.10 * run.seconds, (time_, run.seconds)
    assert time_["binding"] == "tpm" and time_["seconds"] == pytest.approx(15.0)


def test_a_dry_run_stores_nothing_and_lists_invalid_lines(cluster: Cluster) -> None:
    before = {table: cluster.count(table) for table in ("jobs", "items", "results")}
    data = jsonl([chat_line("a", model="steady-model"), "{oops",
                  chat_line("b", model="no-such-model"), chat_line("c", model="gpt-4o-mini")])
    answer = httpx.post(f"{cluster.api_url}/jobs", params={"dry_run": "true"},
                        files={"file": ("in.jsonl", data)}, timeout=30)
    assert answer.status_code == 200, answer.text
    found = answer.json()
    assert found["object"] == "estimate"
    assert found["lines"] == {"total": 4, "valid": 2, "invalid": 2, "errors": [
        {"line": 2, "message": found["lines"]["errors"][0]["message"]},
        {"line": 3, "message": "no deployment serves model 'no-such-model'; add a route for "
                               "it to the deployments file"}]}
    assert "not valid JSON" in found["lines"]["errors"][0]["message"]
    assert {r["route"] for r in found["routes"]} == {"steady-model", "gpt-4o-mini"}
    assert {table: cluster.count(table) for table in before} == before
    # a file that cannot be read at all: the same 400 as submit
    empty = httpx.post(f"{cluster.api_url}/jobs", params={"dry_run": "true"},
                       files={"file": ("in.jsonl", b"\n\n")}, timeout=30)
    assert empty.status_code == 400
    assert "the file is empty" in empty.json()["error"]["message"]
    # and the summary a person reads
    path = cluster.workdir / "mixed.jsonl"
    path.write_bytes(data)
    shown = cluster.cli("estimate", str(path))
    assert "4: 2 valid, 2 invalid" in shown and "line 3: no deployment serves" in shown
    assert {table: cluster.count(table) for table in before} == before


def test_offline_the_same_file_gets_the_apis_estimate_less_the_tenant(
        cluster: Cluster) -> None:
    """`quotaflow estimate --offline` (or with no QUOTAFLOW_API_URL) counts the file from
    the deployments file the API reads: the same object, with the tenant's limits (kept
    in the cluster's database) not checked."""
    path = cluster.workdir / "both.jsonl"
    path.write_bytes(jsonl([*steady_lines()[:40], "{oops", *digits_lines()[:30]]))
    online = json.loads(cluster.cli("estimate", str(path), "--queue", "bulk", "--json"))
    offline = json.loads(cluster.cli("estimate", str(path), "--queue", "bulk", "--json",
                                     "--offline"))
    assert online["tenant"]["enqueued_tokens"]["limit"] == ENQUEUED_LIMIT
    assert offline["tenant"] is None
    assert {k: v for k, v in offline.items() if k != "tenant"} == {
        k: v for k, v in online.items() if k != "tenant"}
    assert len(offline["routes"]) == 2 and offline["lines"]["invalid"] == 1
    shown = cluster.cli("estimate", str(path), "--offline")
    assert "tenant limits: not checked" in shown

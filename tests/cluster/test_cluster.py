"""End to end on the real thing: REST API, two Celery worker processes, Redis, Postgres,
the HTTP mock provider, Flower, and the CLI as a user runs it."""

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from quotaflow.db import get_engine
from tests.harness.factories import chat_line, write_jsonl
from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import REDIS_URL, flush_redis, service_env

PROVIDER_KEY = "sk-quotaflow-test-0123456789abcdef"
FLOWER_AUTH = ("flower-user", "flower-pass-123")


@dataclass
class Cluster:
    api_url: str
    provider_url: str
    slow_provider_url: str
    env: dict[str, str]
    procs: dict[str, Proc]
    workdir: Path

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(quotaflow(*args), env=self.env, capture_output=True, text=True,
                              timeout=timeout, cwd=self.workdir)

    def job(self, job_id: str) -> dict:
        return httpx.get(f"{self.api_url}/jobs/{job_id}", timeout=10).raise_for_status().json()

    def wait_for(self, job_id: str, statuses: tuple[str, ...], timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job["status"] in statuses:
                return job
            time.sleep(0.5)
        raise TimeoutError(f"job {job_id} still {job['status']}: {job['request_counts']}\n"
                           + "\n".join(p.log() for n, p in self.procs.items() if "worker" in n))


@pytest.fixture(scope="module")
def cluster(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("cluster")
    flush_redis(REDIS_URL)
    procs: dict[str, Proc] = {}
    ports = {name: free_port() for name in ("api", "provider", "slow", "flower")}
    env = service_env(QF_TEST_PROVIDER_KEY=PROVIDER_KEY)
    deployments = workdir / "deployments.toml"
    deployments.write_text(f"""
[deployments.mock-http]
provider = "openai"
base_url = "http://127.0.0.1:{ports['provider']}/v1"
model = "mock-http-model"
api_key_env = "QF_TEST_PROVIDER_KEY"
rpm = 60000
tpm = 50000000

[deployments.slow-http]
provider = "openai"
base_url = "http://127.0.0.1:{ports['slow']}/v1"
model = "slow-model"
api_key_env = "QF_TEST_PROVIDER_KEY"
rpm = 60000
tpm = 50000000
# 8 calls in flight per batch: a 1,000-line job takes over 10 s, time for a cancel from a
# CLI that starts slowly on a busy machine
max_concurrency = 8

[routes]
"slow" = "slow-http"
"*" = "mock-http"
""")
    env.update(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
               QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments),
               QUOTAFLOW_API_URL=f"http://127.0.0.1:{ports['api']}",
               QUOTAFLOW_FLOWER_BASIC_AUTH=":".join(FLOWER_AUTH),
               # These tests are about /jobs and the CLI; keys and tenants have their own
               # (tests/cluster/test_tenants.py), so this cluster runs as a development server.
               QUOTAFLOW_AUTH="off")
    try:
        for name, latency in (("provider", "5"), ("slow", "400")):
            procs[name] = Proc(name, quotaflow(
                "mock-provider", "--port", str(ports[name]), "--rpm", "60000", "--tpm", "50000000",
                "--latency-ms", latency, "--api-key-env", "QF_TEST_PROVIDER_KEY"), env, workdir)
        procs["api"] = Proc("api", quotaflow("api", "--port", str(ports["api"])), env, workdir)
        for n in (1, 2):
            procs[f"worker{n}"] = Proc(f"worker{n}", quotaflow(
                "worker", "--queues", "realtime,standard,bulk", "--concurrency", "2",
                "--name", f"w{n}@qftest"), env, workdir)
        for name in ("provider", "slow"):
            procs[name].wait_http(f"http://127.0.0.1:{ports[name]}/healthz")
        procs["api"].wait_http(f"http://127.0.0.1:{ports['api']}/healthz")
        for n in (1, 2):
            procs[f"worker{n}"].wait_until(lambda n=n: " ready." in procs[f"worker{n}"].log())
        yield Cluster(f"http://127.0.0.1:{ports['api']}", f"http://127.0.0.1:{ports['provider']}",
                      f"http://127.0.0.1:{ports['slow']}", env, procs, workdir)
    finally:
        for proc in reversed(procs.values()):
            proc.stop()


def test_submitted_file_gets_exactly_one_matching_result_per_line(cluster: Cluster) -> None:
    # Given a file of 120 distinct prompts
    count = 120
    prompts = {f"req-{i}": f"question number {i} about tides" for i in range(count)}
    path = write_jsonl(cluster.workdir / "prompts.jsonl",
                       [chat_line(cid, prompt) for cid, prompt in prompts.items()])
    httpx.post(f"{cluster.provider_url}/stats/reset")
    # When it is submitted with the CLI and the job is polled over REST
    submitted = cluster.cli("submit", str(path), "--queue", "bulk")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    job = cluster.wait_for(job_id, ("completed", "failed"))
    # Then every custom_id has exactly one result, and each answers its own prompt
    assert job["status"] == "completed" and job["queue"] == "bulk"
    assert job["request_counts"]["completed"] == count and job["request_counts"]["failed"] == 0
    downloaded = cluster.cli("results", job_id, "-o", "out.jsonl")
    assert downloaded.returncode == 0, downloaded.stderr
    lines = [json.loads(line) for line in (cluster.workdir / "out.jsonl").read_text().splitlines()]
    assert [line["custom_id"] for line in lines] == list(prompts)  # input order, each once
    for line in lines:
        body = line["response"]["body"]
        assert line["response"]["status_code"] == 200 and line["error"] is None
        assert body["choices"][0]["message"]["content"] == (
            f"simulated reply to: {prompts[line['custom_id']]}")
        assert body["model"] == "mock-http-model"  # the deployment's model was sent
    assert job["usage"]["total_tokens"] > 0
    # And the provider saw each request exactly once
    stats = httpx.get(f"{cluster.provider_url}/stats").json()
    assert stats["admitted"] == count and stats["duplicate_bodies"] == 0
    assert stats["rejected_429"] == 0
    status = cluster.cli("status", job_id, "--watch")
    assert "completed" in status.stdout and f"completed={count}" in status.stdout
    assert job_id in cluster.cli("jobs").stdout
    assert cluster.cli("errors", job_id).stdout == ""
    retried = cluster.cli("retry", job_id)
    assert retried.returncode == 0 and "retrying 0 failed requests" in retried.stdout


def test_bad_file_is_refused_with_line_numbers_and_nothing_stored(cluster: Cluster) -> None:
    before = httpx.get(f"{cluster.api_url}/jobs", params={"limit": 100}).json()["data"]
    path = write_jsonl(cluster.workdir / "dupes.jsonl",
                       [chat_line("a"), chat_line("b"), chat_line("a")])
    result = cluster.cli("submit", str(path))
    assert result.returncode == 2  # invalid input (cli/exit_codes.py)
    assert "duplicate custom_id 'a' on lines 1 and 3" in result.stderr
    empty = write_jsonl(cluster.workdir / "empty.jsonl", [])
    result = cluster.cli("submit", str(empty))
    assert result.returncode == 2 and "the file is empty" in result.stderr
    response = httpx.post(f"{cluster.api_url}/jobs",
                          files={"file": ("x.jsonl", b"{nope\n[]\n")}).json()
    assert response["error"]["data"][0]["line"] == 1
    assert "no line of the file is a valid request" in response["error"]["message"]
    after = httpx.get(f"{cluster.api_url}/jobs", params={"limit": 100}).json()["data"]
    assert len(after) == len(before)


def test_openapi_docs_are_served(cluster: Cluster) -> None:
    schema = httpx.get(f"{cluster.api_url}/openapi.json").json()
    assert {"/jobs", "/jobs/{job_id}", "/jobs/{job_id}/cancel", "/jobs/{job_id}/results",
            "/jobs/{job_id}/errors", "/healthz"} <= set(schema["paths"])
    assert httpx.get(f"{cluster.api_url}/docs").status_code == 200


def test_limits_show_each_deployment_over_rest_and_cli(cluster: Cluster) -> None:
    data = httpx.get(f"{cluster.api_url}/limits").json()["data"]
    assert {row["deployment"] for row in data} == {"mock-http", "slow-http"}
    row = httpx.get(f"{cluster.api_url}/limits/mock-http").json()
    assert row["rpm"] == 60000 and row["token_capacity"] == 50000000
    assert 0 <= row["utilisation"] <= 1
    assert 0 <= row["tokens_available"] <= row["token_capacity"]
    shown = cluster.cli("limits")
    assert shown.returncode == 0, shown.stderr
    assert "mock-http" in shown.stdout and "slow-http" in shown.stdout
    missing = cluster.cli("limits", "--deployment", "nope")
    assert missing.returncode == 1
    assert "no deployment named 'nope'; known: mock-http, slow-http" in missing.stderr


def test_unknown_job_is_a_clear_404(cluster: Cluster) -> None:
    assert httpx.get(f"{cluster.api_url}/jobs/batch_nope").status_code == 404
    result = cluster.cli("status", "batch_nope")
    assert result.returncode == 1 and "no job with id 'batch_nope'" in result.stderr


def test_cancel_mid_run_keeps_partial_results(cluster: Cluster) -> None:
    # Given a job on a slow provider (400 ms a request)
    path = write_jsonl(cluster.workdir / "slow.jsonl",
                       [chat_line(f"slow-{i}", model="slow") for i in range(1000)])
    job_id = cluster.cli("submit", str(path), "--queue", "standard").stdout.strip()
    deadline = time.monotonic() + 60
    while cluster.job(job_id)["request_counts"]["completed"] == 0:
        assert time.monotonic() < deadline, "no request finished within 60 s"
        time.sleep(0.2)
    # When it is cancelled while running
    result = cluster.cli("cancel", job_id)
    assert result.returncode == 0, result.stderr
    job = cluster.wait_for(job_id, ("cancelled",), timeout=60)
    # Then finished requests are kept, the rest are cancelled, and nothing is lost
    counts = job["request_counts"]
    assert 0 < counts["completed"] < 1000
    assert counts["completed"] + counts["cancelled"] + counts["failed"] == 1000
    output = httpx.get(f"{cluster.api_url}/jobs/{job_id}/results").text.splitlines()
    errors = httpx.get(f"{cluster.api_url}/jobs/{job_id}/errors").text.splitlines()
    assert len(output) == counts["completed"]
    assert {json.loads(e)["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert cluster.cli("errors", job_id).stdout.splitlines() == errors
    ids = [json.loads(line)["custom_id"] for line in output + errors]
    assert sorted(ids) == sorted(f"slow-{i}" for i in range(1000))
    assert job["cancelled_at"] is not None
    refused = cluster.cli("retry", job_id)
    assert refused.returncode == 1 and "only in-progress or completed jobs" in refused.stderr


def test_provider_key_is_never_stored_or_logged(cluster: Cluster, pg_url: str) -> None:
    with get_engine(pg_url).connect() as conn:
        dump = "".join(str(row) for table in ("jobs", "items", "results")
                       for row in conn.execute(text(f"SELECT * FROM {table}")))
    assert dump and PROVIDER_KEY not in dump
    for proc in cluster.procs.values():
        assert PROVIDER_KEY not in proc.log_path.read_text(errors="replace")


def test_flower_lists_the_running_workers(cluster: Cluster) -> None:
    port = free_port()
    flower = Proc("flower", quotaflow("flower", "--port", str(port)), cluster.env,
                  cluster.workdir)
    try:
        url = f"http://127.0.0.1:{port}"
        flower.wait_http(f"{url}/healthcheck")
        assert httpx.get(f"{url}/api/workers").status_code == 401  # basic auth is on

        def both_listed() -> bool:
            workers = httpx.get(f"{url}/api/workers", params={"refresh": "1"},
                                auth=FLOWER_AUTH, timeout=15).json()
            return {"w1@qftest", "w2@qftest"} <= set(workers)

        flower.wait_until(both_listed, timeout=60)
    finally:
        flower.stop()
    assert FLOWER_AUTH[1] not in flower.log_path.read_text(errors="replace")

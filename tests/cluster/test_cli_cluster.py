"""The CLI against a real API and worker, as scripts use it (issue 30, parts 2 and 4):
plain progress lines and exit statuses without a terminal, --json and --quiet, and
/metrics behind QUOTAFLOW_METRICS_TOKEN on the API and on the worker's metrics port."""

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from cli import exit_codes
from tests.harness.cluster import deployment_file, start_provider
from tests.harness.factories import chat_line, write_jsonl
from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import REDIS_URL, flush_redis, service_env

pytestmark = pytest.mark.timeout(300)
TOKEN = "scrape-token-for-the-test"


@dataclass
class Cluster:
    env: dict[str, str]
    api_url: str
    worker_metrics: str
    workdir: Path

    def cli(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        """The command as a script runs it: stdout and stderr are pipes, not a terminal."""
        return subprocess.run(quotaflow(*args), env={**self.env, **env}, capture_output=True,
                              text=True, timeout=120, cwd=self.workdir)


@pytest.fixture(scope="module")
def cluster(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The API and one plain worker, metrics behind a token, on a mock provider whose
    deployment admits 10 requests a second (a 30-line job runs for seconds, so there is
    progress to watch)."""
    flush_redis(REDIS_URL)
    workdir = tmp_path_factory.mktemp("cli")
    provider, provider_url = start_provider(workdir, "--rpm", "600000", "--tpm", "100000000",
                                            "--latency-ms", "50")
    deployments = deployment_file(workdir, "paced", provider_url, rpm=600, burst_seconds=1)
    api_port, metrics_port = free_port(), free_port()
    env = service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                      QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments),
                      QUOTAFLOW_AUTH="false", QUOTAFLOW_METRICS_TOKEN=TOKEN,
                      QUOTAFLOW_API_URL=f"http://127.0.0.1:{api_port}",
                      QUOTAFLOW_PROGRESS_INTERVAL_S="0.5")
    procs = [provider, Proc("api", quotaflow("api", "--port", str(api_port)), env, workdir),
             Proc("worker", quotaflow("worker", "--concurrency", "1", "--name", "cli@qftest",
                                      "--metrics-port", str(metrics_port)), env, workdir)]
    try:
        procs[1].wait_http(f"http://127.0.0.1:{api_port}/healthz")
        procs[2].wait_until(lambda: "cli@qftest ready." in procs[2].log(100_000))
        yield Cluster(env, f"http://127.0.0.1:{api_port}",
                      f"http://127.0.0.1:{metrics_port}/metrics", workdir)
    finally:
        for proc in reversed(procs):
            proc.stop()


def test_a_job_followed_from_a_script(cluster: Cluster) -> None:
    good = write_jsonl(cluster.workdir / "good.jsonl",
                       [chat_line(f"g{i}") for i in range(30)])
    # --quiet: the id alone would be noise too; --json gives the whole job object
    submitted = cluster.cli("submit", str(good), "--json")
    assert submitted.returncode == 0, submitted.stderr
    job = json.loads(submitted.stdout)
    watched = cluster.cli("status", job["id"], "--watch")
    assert watched.returncode == exit_codes.OK, watched.stderr
    # no terminal: plain progress lines (done/total, rate, ETA), never a squeezed bar
    lines = [line for line in watched.stderr.splitlines() if line.startswith(job["id"])]
    assert lines, watched.stderr
    assert lines[-1].startswith(f"{job['id']} completed: 30/30 (100.0%), ")
    assert "req/s" in lines[-1] and "\r" not in watched.stderr and "\x1b" not in watched.stderr
    assert "completed=30 failed=0" in watched.stdout
    # a job that ended before the watch began (a slow start, a late script) still gives it
    again = cluster.cli("status", job["id"], "--watch")
    assert f"{job['id']} completed: 30/30 (100.0%), " in again.stderr, again.stderr
    quiet = cluster.cli("status", job["id"], "--watch", "--quiet")
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (exit_codes.OK, "", "")


def test_failed_lines_exit_three(cluster: Cluster) -> None:
    mixed = write_jsonl(cluster.workdir / "mixed.jsonl", [chat_line("ok"), "not json"])
    submitted = cluster.cli("submit", str(mixed), "--quiet")
    assert (submitted.returncode, submitted.stdout) == (0, ""), submitted.stderr
    [job] = json.loads(cluster.cli("jobs", "--limit", "1", "--json").stdout)
    watched = cluster.cli("status", job["id"], "--watch", "--json")
    assert watched.returncode == exit_codes.FAILED_LINES, watched.stderr
    assert json.loads(watched.stdout)["request_counts"]["failed"] == 1


def test_a_refused_file_exits_two_and_an_unreachable_api_four(cluster: Cluster) -> None:
    dupes = write_jsonl(cluster.workdir / "dupes.jsonl", [chat_line("x"), chat_line("x")])
    refused = cluster.cli("submit", str(dupes))
    assert refused.returncode == exit_codes.INVALID_INPUT, refused.stderr
    assert "duplicate custom_id 'x'" in refused.stderr and "Traceback" not in refused.stderr
    away = cluster.cli("status", "batch_x", QUOTAFLOW_API_URL=f"http://127.0.0.1:{free_port()}")
    assert away.returncode == exit_codes.UNREACHABLE, away.stderr
    assert "cannot reach the quotaflow API" in away.stderr
    missing = cluster.cli("status", "batch_nope")
    assert missing.returncode == exit_codes.ERROR, missing.stderr


def test_metrics_need_the_bearer_token_on_the_api_and_the_worker(cluster: Cluster) -> None:
    """Last in the module: by now jobs have run, so both endpoints have figures."""
    for url in (f"{cluster.api_url}/metrics", cluster.worker_metrics):
        refused = httpx.get(url, timeout=10)
        assert refused.status_code == 401, url
        assert "quotaflow_" not in refused.text
        assert refused.headers["www-authenticate"].startswith("Bearer")
        assert httpx.get(url, headers={"Authorization": "Bearer wrong"},
                         timeout=10).status_code == 401
        # as Prometheus sends it (scrape config `authorization: {type: Bearer}`)
        scraped = httpx.get(url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
        # the jobs above ran: the API counts them, the worker its admissions
        assert scraped.status_code == 200, url
        assert ("quotaflow_jobs" if url.startswith(cluster.api_url)
                else "quotaflow_admitted_requests_total") in scraped.text, url

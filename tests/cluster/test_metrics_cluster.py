"""The metrics on the real thing: four Celery workers with --metrics-port, the API's
/metrics, the strict mock provider failing on purpose, and a real Prometheus server
scraping them all.

The proof that counting in many processes adds up: the provider counters summed over
every worker equal what the mock provider itself says it saw (GET /stats).
"""

import io
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.config import Settings
from quotaflow.dispatch.queues import BatchRef
from quotaflow.ingest import pipeline
from tests.harness.cluster import deployment_file, job_status, start_provider
from tests.harness.factories import chat_line, jsonl
from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import service_env
from workers.dispatch import CeleryDispatcher

WORKERS = 4
DEPLOYMENT = "metered"
LINES = 600


@dataclass
class Metered:
    api: str
    workers: list[str]
    provider: str
    prometheus: str
    settings: Settings
    worker_procs: list[Proc]


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a /metrics page, by name and labels."""
    page = httpx.get(f"{url}/metrics", timeout=10).raise_for_status().text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(page) for s in family.samples}


def total(samples: dict, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include `labels`."""
    return sum(value for (sample, sample_labels), value in samples.items()
               if sample == name and set(labels.items()) <= set(sample_labels))


def cluster_total(urls: list[str], name: str, **labels: str) -> float:
    return sum(total(scrape(url), name, **labels) for url in urls)


def start_prometheus(tmp_path: Path, api: str, workers: list[str]) -> tuple[Proc, str]:
    """A Prometheus server of our own: its port, its data directory, stopped by pid."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("the prometheus binary is missing (scripts/test installs Debian's "
                    "prometheus package with apt-get)")
    config = tmp_path / "prometheus.yml"
    targets = ", ".join(f'"{url.removeprefix("http://")}"' for url in workers)
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f'  - {{job_name: quotaflow-api, static_configs: [{{targets: ["{api[7:]}"]}}]}}\n'
        f"  - {{job_name: quotaflow-workers, static_configs: [{{targets: [{targets}]}}]}}\n")
    port = free_port()
    proc = Proc("prometheus", [binary, f"--config.file={config}",
                               f"--storage.tsdb.path={tmp_path / 'prometheus-data'}",
                               f"--web.listen-address=127.0.0.1:{port}"],
                service_env(), tmp_path)
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(f"{url}/-/ready")
    return proc, url


def promql(url: str, query: str) -> list[dict]:
    answer = httpx.get(f"{url}/api/v1/query", params={"query": query}, timeout=10)
    return answer.raise_for_status().json()["data"]["result"]


@pytest.fixture
def metered(pg_sessions: sessionmaker[Session], pg_url: str, redis_url: str,
            tmp_path: Path) -> Iterator[Metered]:
    procs: list[Proc] = []
    try:
        provider, provider_url = start_provider(
            tmp_path, "--rpm", "600000", "--tpm", "100000000", "--latency-ms", "150",
            "--fault", "500=0.05", "--fault", "429=0.05")
        procs.append(provider)
        deployments = deployment_file(tmp_path, DEPLOYMENT, provider_url)
        env = service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=redis_url,
                          QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments), QUOTAFLOW_AUTH="off",
                          QUOTAFLOW_BATCH_SIZE="10")
        ports = [free_port() for _ in range(WORKERS)]
        # `bulk` is consumed by nobody: messages put there wait, to be measured.
        for n, port in enumerate(ports, 1):
            procs.append(Proc(f"worker{n}", quotaflow(
                "worker", "--queues", "realtime,standard", "--concurrency", "2",
                "--name", f"metrics{n}@qftest", "--metrics-port", str(port)), env, tmp_path))
        api_port = free_port()
        procs.append(Proc("api", quotaflow("api", "--port", str(api_port)), env, tmp_path))
        api = f"http://127.0.0.1:{api_port}"
        procs[-1].wait_http(f"{api}/healthz")
        workers = [f"http://127.0.0.1:{port}" for port in ports]
        for proc, url in zip(procs[1:-1], workers, strict=True):
            proc.wait_until(lambda p=proc: " ready." in p.log())
            proc.wait_http(f"{url}/metrics")
        prometheus, prometheus_url = start_prometheus(tmp_path, api, workers)
        procs.append(prometheus)
        settings = Settings(database_url=pg_url, broker_url=redis_url,
                            deployments_file=deployments, batch_size=10, _env_file=None)
        yield Metered(api, workers, provider_url, prometheus_url, settings, procs[1:1 + WORKERS])
    finally:
        for proc in reversed(procs):
            proc.stop()


def test_queue_depth_and_the_oldest_messages_age_are_read_from_the_broker(
        metered: Metered) -> None:
    # Given three batches queued where no worker takes them
    CeleryDispatcher(metered.settings.broker_url).dispatch(
        "bulk", [BatchRef("job-nobody-runs", line, line) for line in (1, 2, 3)])
    time.sleep(1.5)
    # When the API is scraped
    samples = scrape(metered.api)
    # Then it counts them and dates the oldest by the header the dispatcher put on it
    assert total(samples, "quotaflow_queue_depth", queue="bulk") == 3
    assert total(samples, "quotaflow_queue_depth", queue="standard") == 0
    assert 1.5 <= total(samples, "quotaflow_queue_oldest_age_seconds", queue="bulk") < 60
    assert total(samples, "quotaflow_queue_oldest_age_seconds", queue="standard") == 0


def test_a_worker_removes_its_metrics_directory_when_it_stops(metered: Metered) -> None:
    # Given each worker's own directory of metrics files, named in its log
    directories = [Path(re.search(r"files in (\S+)\)", proc.log()).group(1))
                   for proc in metered.worker_procs]
    assert len(set(directories)) == WORKERS and all(d.is_dir() for d in directories)
    # When one worker stops
    metered.worker_procs[0].stop()
    # Then its directory is gone, and the others' are not
    assert not directories[0].exists()
    assert all(d.is_dir() for d in directories[1:])


def test_provider_counters_summed_over_the_workers_equal_the_providers_own(
        metered: Metered, pg_sessions: sessionmaker[Session]) -> None:
    # Given a job of distinct requests against a provider that fails 5% with 500, 5% with 429
    lines = [chat_line(f"m-{i}", f"question {i} about the moon") for i in range(LINES)]
    job = pipeline.create_job_in_process(
        pg_sessions, io.BytesIO(jsonl(lines)), settings=metered.settings,
        deployments=metered.settings.load_deployments(),
        dispatcher=CeleryDispatcher(metered.settings.broker_url), queue="standard")
    # When the API and the workers are scraped while it runs
    during: list[tuple[dict, float]] = []
    deadline = time.monotonic() + 180
    while job_status(pg_sessions, job.id) == "in_progress":
        assert time.monotonic() < deadline, "the job did not finish"
        during.append((scrape(metered.api),
                       cluster_total(metered.workers, "quotaflow_provider_responses_total")))
        time.sleep(0.3)
    assert job_status(pg_sessions, job.id) == "completed"
    # Then the scrapes during the job saw it running and the calls being counted
    seen = [(api, calls) for api, calls in during
            if total(api, "quotaflow_jobs", status="in_progress") == 1]
    assert seen, "no scrape saw the job in progress"
    assert any(calls > 0 and total(api, "quotaflow_requests", status="pending")
               + total(api, "quotaflow_requests", status="running") > 0 for api, calls in seen)
    # And afterwards every worker's counters add up to what the provider saw
    stats = httpx.get(f"{metered.provider}/stats", timeout=10).json()
    workers = [scrape(url) for url in metered.workers]

    def cluster(name: str, **labels: str) -> float:
        return sum(total(samples, name, deployment=DEPLOYMENT, **labels) for samples in workers)

    assert sum(1 for samples in workers
               if total(samples, "quotaflow_provider_responses_total")) > 1, "one worker did all"
    assert cluster("quotaflow_provider_responses_total") == stats["requests_total"]
    assert cluster("quotaflow_provider_responses_total", code="200") == stats["admitted"] == LINES
    assert cluster("quotaflow_provider_responses_total", code="500") > 0
    assert cluster("quotaflow_provider_responses_total", code="429") > 0
    assert cluster("quotaflow_provider_tokens_total", kind="prompt") == stats["prompt_tokens"]
    assert (cluster("quotaflow_provider_tokens_total", kind="completion")
            == stats["completion_tokens"])
    assert cluster("quotaflow_provider_latency_seconds_count") == stats["requests_total"]
    assert cluster("quotaflow_admitted_requests_total", queue="standard") == stats["requests_total"]
    assert sum(total(samples, "quotaflow_admission_wait_seconds_count", queue="standard")
               for samples in workers) == stats["requests_total"]
    # And the API reports the state: the job done, the budget and the circuit readable
    api = scrape(metered.api)
    assert total(api, "quotaflow_jobs", status="completed") == 1
    assert total(api, "quotaflow_requests") == 0  # no unfinished job left
    assert 0 <= total(api, "quotaflow_budget_utilisation", deployment=DEPLOYMENT) <= 1
    assert total(api, "quotaflow_budget_limit_requests_per_minute",
                 deployment=DEPLOYMENT) == 600000
    assert total(api, "quotaflow_budget_available_tokens", deployment=DEPLOYMENT) > 0
    assert total(api, "quotaflow_circuit_state", deployment=DEPLOYMENT) in (0, 1, 2)
    assert total(api, "quotaflow_metrics_source_up") == 4  # every source read
    # And a real Prometheus scraped them all and answers PromQL
    _prometheus_agrees(metered, stats["requests_total"])


def _prometheus_agrees(metered: Metered, calls: int) -> None:
    deadline = time.monotonic() + 30
    while True:
        up = promql(metered.prometheus, "up == 1")
        utilisation = promql(metered.prometheus, "quotaflow_budget_utilisation")
        summed = promql(metered.prometheus, "sum(quotaflow_provider_responses_total)")
        if (len(up) == WORKERS + 1 and utilisation and summed
                and float(summed[0]["value"][1]) == calls):
            break
        assert time.monotonic() < deadline, (up, utilisation, summed, calls)
        time.sleep(0.5)
    assert [r["metric"]["deployment"] for r in utilisation] == [DEPLOYMENT]
    assert 0 <= float(utilisation[0]["value"][1]) <= 1

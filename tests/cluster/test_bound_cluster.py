"""What bound a job (quotaflow/observe/bound.py) on jobs made to be bound by one thing each, run
by a real Celery worker against the strict mock provider: a tight RPM (budget), calls of
500 ms at max_concurrency 2 in one batch (provider), and batches of 2 lines taken one at
a time by a worker of one slot, with 16 calls allowed in flight (workers). The API's
/jobs/{id}/bound, the report and `quotaflow status` say the same."""

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from quotaflow.config import Settings
from quotaflow.observe import bound_data
from tests.harness.cluster import start_provider, start_workers, submit_and_finish
from tests.harness.factories import chat_line
from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import REDIS_URL, flush_redis, service_env


@dataclass
class Setup:
    settings: Settings
    env: dict[str, str]
    api_url: str
    workdir: Path


@pytest.fixture(scope="module")
def setup(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    workdir = tmp_path_factory.mktemp("bound")
    flush_redis(REDIS_URL)
    procs: list[Proc] = []
    try:
        fast, fast_url = start_provider(workdir, "--rpm", "60000", "--tpm", "50000000",
                                        "--latency-ms", "5")
        procs.append(fast)
        (workdir / "slow").mkdir()
        slow, slow_url = start_provider(workdir / "slow", "--rpm", "60000", "--tpm", "50000000",
                                        "--latency-ms", "500")
        procs.append(slow)
        deployments = workdir / "deployments.toml"
        deployments.write_text(
            # 1 request a second, 1 at once: 8 lines take 7 s of refill
            f'[deployments.tight]\nprovider = "openai"\nbase_url = "{fast_url}/v1"\n'
            'model = "tight"\nrpm = 60\ntpm = 10000000\nburst_seconds = 1\n'
            'safety_margin_s = 0\n'
            # 2 calls of 500 ms at a time, and all the budget wanted
            f'[deployments.narrow]\nprovider = "openai"\nbase_url = "{slow_url}/v1"\n'
            'model = "narrow"\nrpm = 60000\ntpm = 50000000\nmax_concurrency = 2\n'
            # 16 calls at a time could go: only the batches' 2 lines are there
            f'[deployments.wide]\nprovider = "openai"\nbase_url = "{slow_url}/v1"\n'
            'model = "wide"\nrpm = 60000\ntpm = 50000000\nmax_concurrency = 16\n')
        port = free_port()
        env = service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                          QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments), QUOTAFLOW_AUTH="off",
                          QUOTAFLOW_API_URL=f"http://127.0.0.1:{port}")
        api = Proc("api", quotaflow("api", "--port", str(port)), env, workdir)
        procs.append(api)
        # One worker of one slot: batches are taken one at a time
        procs.extend(start_workers(env, workdir, "bound", count=1, concurrency=1))
        api.wait_http(f"http://127.0.0.1:{port}/healthz")
        settings = Settings(database_url=pg_url, broker_url=REDIS_URL,
                            deployments_file=deployments, batch_size=2, _env_file=None)
        yield Setup(settings, env, f"http://127.0.0.1:{port}", workdir)
    finally:
        for proc in reversed(procs):
            proc.stop()


def run(setup: Setup, sessions, model: str, count: int,
        batch_size: int = 2) -> tuple[str, bound_data.Bound]:
    lines = [chat_line(f"{model}-{i}", model=model) for i in range(count)]
    settings = setup.settings.model_copy(update={"batch_size": batch_size})
    job = submit_and_finish(sessions, settings, lines, timeout=90)
    assert job["status"] == "completed", job
    with sessions() as session:
        found = bound_data.job_bound(session, job["id"], setup.settings.load_deployments(),
                                     setup.settings)
    print(model, found.summary())  # shown by pytest -rA: the shares behind the verdict
    return job["id"], found


def test_a_tight_rpm_is_budget_bound(setup: Setup, pg_sessions) -> None:
    job_id, bound = run(setup, pg_sessions, "tight", 8)
    assert (bound.cause, bound.deployment, bound.dimension) == ("budget", "tight", "rpm"), bound
    assert "the budget is the limit" in bound.advice
    # The API, the report and the CLI say the same
    api = httpx.get(f"{setup.api_url}/jobs/{job_id}/bound", timeout=30).json()
    assert (api["cause"], api["deployment"], api["dimension"]) == ("budget", "tight", "rpm")
    report = httpx.get(f"{setup.api_url}/jobs/{job_id}/report", timeout=60).text
    assert "What bound this job" in report and "data-cause='budget'" in report
    status = subprocess.run(quotaflow("status", job_id), env=setup.env, capture_output=True,
                            text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert "bound: time went to budget: tight rpm" in status.stdout


def test_calls_at_max_concurrency_are_provider_bound(setup: Setup, pg_sessions) -> None:
    # One batch of 12: the worker keeps its 2 calls in flight from start to end
    _, bound = run(setup, pg_sessions, "narrow", 12, batch_size=12)
    assert (bound.cause, bound.deployment) == ("provider", "narrow"), bound
    assert "max_concurrency (now 2)" in bound.advice


def test_batches_waiting_for_one_worker_slot_are_worker_bound(setup: Setup,
                                                              pg_sessions) -> None:
    _, bound = run(setup, pg_sessions, "wide", 12)
    assert bound.cause == "workers", bound
    assert "more workers" in bound.advice

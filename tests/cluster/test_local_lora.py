"""LoRA adapters on the transformers engine (peft), through a real `quotaflow worker
--deployment` over Celery, Redis and PostgreSQL: each line of a job mixing two adapters
and the base model runs with its own adapter (tests/harness/lora_jobs.py)."""

import os

# No model hub here: every model is built and loaded from a local directory.
os.environ["HF_HUB_OFFLINE"] = "1"

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from quotaflow.config import Settings
from quotaflow.db import session_factory
from tests.harness.lora_jobs import LoraRun, deployments_toml, run_mixed_and_alone, write_models
from tests.harness.procs import Proc, quotaflow
from tests.harness.servers import REDIS_URL, flush_redis, service_env

pytestmark = pytest.mark.timeout(600)

DEPLOYMENT = "tiny-lora"


@pytest.fixture
def run(pg_url: str, tmp_path: Path) -> Iterator[LoraRun]:
    base, adapters = write_models(tmp_path)
    path = tmp_path / "deployments.toml"
    path.write_text(deployments_toml(DEPLOYMENT, "transformers", base, adapters,
                                     'device = "cpu"\nmax_batch_size = 16\nmax_wait_ms = 200\n'))
    flush_redis(REDIS_URL)
    env = service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                      QUOTAFLOW_DEPLOYMENTS_FILE=str(path), HF_HUB_OFFLINE="1")
    worker = Proc("worker-lora", quotaflow("worker", "--deployment", DEPLOYMENT,
                                           "--concurrency", "2", "--name", "lora@qftest"),
                  env, tmp_path)
    try:
        worker.wait_until(lambda: " ready." in worker.log(), timeout=180)
        settings = Settings(database_url=pg_url, broker_url=REDIS_URL, batch_size=50,
                            deployments_file=path, _env_file=None)
        yield LoraRun(worker, session_factory(pg_url), settings)
    finally:
        worker.stop()


def test_each_line_runs_with_its_own_adapter(run: LoraRun) -> None:
    run_mixed_and_alone(run)
    # And the model batches were grouped by adapter: batches ran for each of them
    batches = re.findall(r"batch of (\d+) generate requests", run.worker.log(200_000))
    assert batches, run.worker.log()

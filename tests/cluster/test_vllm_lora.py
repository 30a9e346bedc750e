"""LoRA adapters on vLLM's engine, through a real `quotaflow worker --deployment` under
vLLM's interpreter (its CPU build, scripts/vllm-venv): each line of a job mixing two
adapters and the base model runs with its own adapter (tests/harness/lora_jobs.py), and
the engine ran them in one continuous batch, as its own per-step stats say."""

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from quotaflow.config import Settings
from quotaflow.db import session_factory
from tests.harness.lora_jobs import (
    ADAPTERS,
    LoraRun,
    deployments_toml,
    run_mixed_and_alone,
    write_models,
)
from tests.harness.servers import REDIS_URL, flush_redis
from tests.harness.vllm_server import engine_env, start_engine_worker

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

DEPLOYMENT = "tiny-vllm-lora"
# float32: the answers compared are greedy, and a batch of other rows must not tip a
# near tie in bfloat16's rounding.
ENGINE = 'dtype = "float32"\nmax_model_len = 512\nenforce_eager = true\n'


@pytest.fixture(scope="module")
def run(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoraRun]:
    workdir = tmp_path_factory.mktemp("vllm-lora")
    base, adapters = write_models(workdir)
    path = workdir / "deployments.toml"
    path.write_text(deployments_toml(DEPLOYMENT, "vllm", base, adapters, ENGINE))
    flush_redis(REDIS_URL)
    env = engine_env(workdir, QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                     QUOTAFLOW_DEPLOYMENTS_FILE=str(path))
    worker = start_engine_worker(env, workdir, DEPLOYMENT, concurrency=2)
    settings = Settings(database_url=pg_url, broker_url=REDIS_URL, batch_size=50,
                        deployments_file=path, _env_file=None)
    try:
        yield LoraRun(worker, session_factory(pg_url), settings)
    finally:
        worker.stop()


def test_each_line_runs_with_its_own_adapter_in_one_continuous_batch(run: LoraRun) -> None:
    log_path: Path = run.worker.log_path
    run_mixed_and_alone(run)
    # And vLLM's scheduler ran both adapters' requests and the base model's in one step
    log = log_path.read_text(errors="replace")
    steps = re.findall(r"vLLM ran requests of (\d+) models in one step \((.*)\)$", log,
                       re.MULTILINE)
    assert any(int(count) == 3 and all(f"{a}: " in held for a in ADAPTERS)
               for count, held in steps), (steps, log[-6000:])

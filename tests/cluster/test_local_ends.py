"""A transformers deployment's commands end when their work does, or when told: `quotaflow
run` exits within seconds of its job's end with the job's exit status, Ctrl-C mid-job
ends it leaving the job to resume, and `quotaflow worker --deployment` stopped with
SIGTERM finishes or hands back its batch and exits; no process of theirs is left.
(The same on vLLM's engine: test_vllm_ends.py.)"""

import os

# No model hub here: every model is built and loaded from a local directory.
os.environ["HF_HUB_OFFLINE"] = "1"

import io
import signal
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from quotaflow.config import Settings
from quotaflow.db import session_factory
from quotaflow.dispatch.queues import PlacingDispatcher
from quotaflow.ingest import pipeline
from quotaflow.models import Item
from tests.harness.cluster import job_status
from tests.harness.factories import jsonl
from tests.harness.local_ends import (
    ENDS_WITHIN_S,
    chat_lines,
    interrupt_run,
    item_counts,
    run_env,
    run_to_end,
    write_input,
)
from tests.harness.local_ends import job_status as run_job_status
from tests.harness.marked import marked, new_mark, wait_none_marked
from tests.harness.procs import Proc, quotaflow
from tests.harness.servers import REDIS_URL, ROOT, flush_redis, service_env
from tests.harness.tiny_model import save_tiny_model
from workers.dispatch import CeleryDispatcher

pytestmark = pytest.mark.timeout(300)

DEPLOYMENT = """
[deployments.tiny-local]
provider = "local"
model = "tiny"
model_path = "{path}"
device = "cpu"
rpm = 1000000
tpm = 100000000
max_batch_size = 4
max_wait_ms = 20
default_temperature = 0
max_concurrency = 16
[routes]
"*" = "tiny-local"
"""


@pytest.fixture
def deployments(tmp_path: Path) -> Path:
    # Never ends at EOS: every reply is its max_tokens long, so a job's length is known.
    model_dir = save_tiny_model(tmp_path / "tiny-gpt2", eos_bias=-100.0, context=1024)
    path = tmp_path / "deployments.toml"
    path.write_text(DEPLOYMENT.format(path=model_dir))
    return path


def _env(deployments: Path, **extra: str) -> dict[str, str]:
    return service_env(QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments), HF_HUB_OFFLINE="1",
                       PYTHONPATH=str(ROOT), **extra)


def test_run_exits_with_its_job_and_its_status(deployments: Path, tmp_path: Path) -> None:
    # Given a file of 12 lines for the local model and one that is not JSON
    write_input(tmp_path / "in.jsonl", [*chat_lines(12, 8), "not json"])
    env = run_env(_env(deployments), tmp_path)
    # When it runs to the end
    ended = run_to_end(sys.executable, env, tmp_path, "in.jsonl")
    # Then the command exits within seconds of the job's end, with 3 (a line failed)
    assert ended.returncode == 3, ended.stderr[-6000:]
    assert "12 succeeded, 1 failed of 13" in ended.stderr
    assert ended.after_s < ENDS_WITHIN_S, ended
    # and no process of it is left
    assert ended.left == [], ended


def test_ctrl_c_mid_job_ends_the_run_and_leaves_the_job_to_resume(
        deployments: Path, tmp_path: Path) -> None:
    # Given a run of 400 long answers, interrupted once 8 have been stored
    write_input(tmp_path / "in.jsonl", chat_lines(400, 200))
    env = run_env(_env(deployments), tmp_path)
    ended = interrupt_run(sys.executable, env, tmp_path, "in.jsonl", after_done=8)
    # Then it exits within seconds, as interrupted, with nothing of it left running
    assert ended.returncode == 130, ended.stderr[-6000:]
    assert ended.after_s < ENDS_WITHIN_S, ended
    assert ended.left == [], ended
    # And the job is still in progress, no line failed: the rest are there to run again
    counts = item_counts(tmp_path)
    assert run_job_status(tmp_path) == "in_progress", counts
    assert counts.get("failed", 0) == 0 and counts.get("succeeded", 0) >= 8, counts
    assert counts.get("pending", 0) + counts.get("running", 0) > 0, counts


def test_worker_told_to_stop_ends_with_its_batch(deployments: Path, tmp_path: Path,
                                                 pg_url: str) -> None:
    # Given a --deployment worker, running a job of 60 answers in batches of 10
    flush_redis(REDIS_URL)
    env = {**_env(deployments, QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                  QUOTAFLOW_BATCH_SIZE="10", QUOTAFLOW_LEASE_SECONDS="5"), **new_mark()}
    settings = Settings(database_url=pg_url, broker_url=REDIS_URL, batch_size=10,
                        deployments_file=deployments, _env_file=None)
    sessions = session_factory(pg_url)
    worker = _start_worker(env, tmp_path, "first")
    catalog = settings.load_deployments()
    dispatcher = PlacingDispatcher(CeleryDispatcher(REDIS_URL), sessions, catalog)
    job = pipeline.create_job_in_process(
        sessions, io.BytesIO(jsonl(chat_lines(60, 100))), settings=settings,
        deployments=catalog, dispatcher=dispatcher, queue="bulk").id

    def done() -> int:
        with sessions() as session:
            return session.scalar(select(func.count()).select_from(Item).where(
                Item.job_id == job, Item.status == "succeeded")) or 0

    deadline = time.monotonic() + 120
    while done() < 3:
        assert time.monotonic() < deadline, worker.log()
        time.sleep(0.1)
    running = len(marked(env))
    # When it is told to stop (SIGTERM to its process group, as a process manager does)
    os.killpg(worker.pid, signal.SIGTERM)
    asked = time.monotonic()
    try:
        worker.popen.wait(ENDS_WITHIN_S * 3)
    finally:
        took = time.monotonic() - asked
        worker.stop()
    # Then it exits within seconds, and no process of it is left
    assert took < ENDS_WITHIN_S, (took, worker.log())
    assert running >= 1 and wait_none_marked(env, 1.0) == [], worker.log()
    assert worker.popen.returncode == 0, worker.log()
    # And no line failed: a second worker finishes the job
    second = _start_worker(env, tmp_path, "second")
    try:
        deadline = time.monotonic() + 120
        while job_status(sessions, job) == "in_progress":
            assert time.monotonic() < deadline, second.log()
            time.sleep(0.3)
    finally:
        second.stop()
    assert job_status(sessions, job) == "completed"
    assert done() == 60, second.log()


def _start_worker(env: dict[str, str], workdir: Path, name: str) -> Proc:
    worker = Proc(f"worker-{name}", quotaflow("worker", "--deployment", "tiny-local",
                                              "--concurrency", "2", "--name",
                                              f"{name}@qftest"), env, workdir)
    worker.wait_until(lambda: " ready." in worker.log(), timeout=120)
    return worker

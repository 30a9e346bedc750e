"""A vLLM deployment's commands end when their work does, or when told, and take vLLM's
processes (its engine core and model worker) with them: `quotaflow run` exits within
seconds of its job's end with the job's exit status, Ctrl-C mid-job ends it leaving the
job to resume, and `quotaflow worker --deployment` stopped with SIGTERM hands back or
finishes its batch and exits. (The same on transformers: test_local_ends.py.)

Each command loads its own engine (about 20 s on 2 cores): the tiny random-weight Llama
of tests/harness/vllm_server.py, under vLLM's interpreter (scripts/vllm-venv).
"""

import io
import os
import signal
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
from tests.harness.servers import REDIS_URL, flush_redis
from tests.harness.vllm_server import engine_env, start_engine_worker, worker_python, write_model
from workers.dispatch import CeleryDispatcher

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(400)]

DEPLOYMENT = "tiny-vllm"
# vLLM's own processes beside the command's: its engine core and one model worker.
VLLM_PROCESSES = 2


@pytest.fixture(scope="module")
def deployments(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("vllm-ends")
    model_dir = write_model(workdir / "model")
    path = workdir / "deployments.toml"
    path.write_text(
        f'[deployments.{DEPLOYMENT}]\nprovider = "local"\nengine = "vllm"\nmodel = "tiny"\n'
        f'model_path = "{model_dir}"\ndtype = "bfloat16"\nmax_model_len = 1024\n'
        "max_num_seqs = 4\nenforce_eager = true\nrpm = 1000000\ntpm = 100000000\n"
        f'max_concurrency = 64\ndefault_temperature = 0\n[routes]\n"*" = "{DEPLOYMENT}"\n')
    return path


def test_run_exits_with_its_job_and_its_status(deployments: Path, tmp_path: Path) -> None:
    # Given a file of 20 lines for the vLLM deployment and one that is not JSON
    write_input(tmp_path / "in.jsonl", [*chat_lines(20, 16), "not json"])
    env = run_env(engine_env(tmp_path, QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments)), tmp_path)
    # When it runs to the end
    ended = run_to_end(worker_python(), env, tmp_path, "in.jsonl")
    # Then the command exits within seconds of the job's end, with 3 (a line failed)
    assert ended.returncode == 3, ended.stderr[-6000:]
    assert "20 succeeded, 1 failed of 21" in ended.stderr
    assert ended.after_s < ENDS_WITHIN_S, (ended.after_s, ended.stderr[-6000:])
    # and vLLM's processes, there while it ran, ended with it
    assert ended.most_processes >= 1 + VLLM_PROCESSES, ended.most_processes
    assert ended.left == [], ended.left


def test_ctrl_c_mid_job_ends_the_run_and_its_engine(deployments: Path, tmp_path: Path) -> None:
    # Given a run of 200 long answers (four at a time in the engine), interrupted once
    # 4 have been stored
    write_input(tmp_path / "in.jsonl", chat_lines(200, 400))
    env = run_env(engine_env(tmp_path, QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments)), tmp_path)
    ended = interrupt_run(worker_python(), env, tmp_path, "in.jsonl", after_done=4)
    # Then it exits within seconds, as interrupted, and vLLM's processes with it
    assert ended.returncode == 130, ended.stderr[-6000:]
    assert ended.after_s < ENDS_WITHIN_S, (ended.after_s, ended.stderr[-6000:])
    assert ended.most_processes >= 1 + VLLM_PROCESSES, ended.most_processes
    assert ended.left == [], ended.left
    # And the job is still in progress, no line failed: the rest are there to run again
    counts = item_counts(tmp_path)
    assert run_job_status(tmp_path) == "in_progress", counts
    assert counts.get("failed", 0) == 0 and counts.get("succeeded", 0) >= 4, counts
    assert counts.get("pending", 0) + counts.get("running", 0) > 0, counts


def test_worker_told_to_stop_hands_back_its_batch_and_ends_its_engine(
        deployments: Path, tmp_path: Path, pg_url: str) -> None:
    # Given a --deployment worker running a job of long answers, a few of them stored
    flush_redis(REDIS_URL)
    env = {**engine_env(tmp_path, QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                        QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments)), **new_mark()}
    worker = start_engine_worker(env, tmp_path, DEPLOYMENT, concurrency=2)
    settings = Settings(database_url=pg_url, broker_url=REDIS_URL, batch_size=20,
                        deployments_file=deployments, _env_file=None)
    sessions = session_factory(pg_url)
    catalog = settings.load_deployments()
    dispatcher = PlacingDispatcher(CeleryDispatcher(REDIS_URL), sessions, catalog)
    job = pipeline.create_job_in_process(
        sessions, io.BytesIO(jsonl(chat_lines(80, 400))), settings=settings,
        deployments=catalog, dispatcher=dispatcher, queue="bulk").id

    def count(status: str) -> int:
        with sessions() as session:
            return session.scalar(select(func.count()).select_from(Item).where(
                Item.job_id == job, Item.status == status)) or 0

    try:
        deadline = time.monotonic() + 120
        while count("succeeded") < 2:
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
    finally:
        worker.stop()
    # Then it exits within seconds, and vLLM's processes with it
    assert took < ENDS_WITHIN_S, (took, worker.log())
    assert running >= 1 + VLLM_PROCESSES, running
    assert wait_none_marked(env, 1.0) == [], worker.log()
    # And no line failed: what it had not answered waits to run again
    assert count("failed") == 0, worker.log()
    assert job_status(sessions, job) == "in_progress"
    assert count("pending") + count("running") > 0

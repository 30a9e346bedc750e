"""Jobs on a local model through real processes: the REST API, a Celery worker started
with --deployment (threads sharing the model it loaded from a directory), a general worker
that holds no model, Redis and Postgres; and `quotaflow run`, which loads it in process."""

import os

# No model hub here: every model is built and loaded from a local directory.
os.environ["HF_HUB_OFFLINE"] = "1"

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer

from tests.harness.factories import chat_line, write_jsonl
from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import REDIS_URL, ROOT, flush_redis, service_env
from tests.harness.tiny_model import SENTENCES, save_tiny_model

LOCAL_LINES = 40
TINY_DEPLOYMENT = """
[deployments.tiny-local]
provider = "local"
model = "tiny"
model_path = "{path}"
device = "cpu"
rpm = 100000
tpm = 10000000
max_batch_size = 8
max_wait_ms = 50
default_temperature = 0
max_concurrency = 16
"""
REMOTE_LINES = 10


@pytest.fixture
def local_cluster(pg_url: str, tmp_path: Path) -> Iterator[tuple[str, dict[str, Proc], Path]]:
    # Never ends at EOS, so each reply is exactly its max_tokens long
    model_dir = save_tiny_model(tmp_path / "tiny-gpt2", eos_bias=-100.0)
    deployments = tmp_path / "deployments.toml"
    deployments.write_text(TINY_DEPLOYMENT.format(path=model_dir) + """
[deployments.remote]
provider = "mock"
model = "gpt-4o-mini"
rpm = 100000
tpm = 10000000

[routes]
"tiny" = "tiny-local"
"*" = "remote"
""")
    flush_redis(REDIS_URL)
    port = free_port()
    env = service_env(QUOTAFLOW_AUTH="off",  # keys are tests/cluster/test_tenants.py's
                      QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                      QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments), QUOTAFLOW_BATCH_SIZE="10",
                      HF_HUB_OFFLINE="1")
    procs = {
        "api": Proc("api", quotaflow("api", "--port", str(port)), env, tmp_path),
        "general": Proc("general", quotaflow("worker", "--concurrency", "2",
                                             "--name", "general@qftest"), env, tmp_path),
        "local": Proc("local", quotaflow("worker", "--deployment", "tiny-local",
                                         "--concurrency", "3", "--name", "gpu0@qftest"),
                      env, tmp_path),
    }
    try:
        procs["api"].wait_http(f"http://127.0.0.1:{port}/healthz")
        for name in ("general", "local"):
            procs[name].wait_until(lambda n=name: " ready." in procs[n].log(), timeout=180)
        yield f"http://127.0.0.1:{port}", procs, model_dir
    finally:
        for proc in procs.values():
            proc.stop()


def mixed_lines() -> list[dict]:
    """Local lines in two blocks around a block for the remote model (a job's lines are
    split into runs bound for one queue, so blocks keep its batches whole)."""
    lines = []
    for i in range(LOCAL_LINES + REMOTE_LINES):
        if LOCAL_LINES // 2 <= i < LOCAL_LINES // 2 + REMOTE_LINES:
            lines.append(chat_line(f"remote-{i}", f"remote question {i}"))
        else:
            lines.append(chat_line(f"local-{i}", f"{SENTENCES[i % 7]} number {i}",
                                   model="tiny", max_tokens=4 + i % 9))
    return lines


def test_a_job_runs_on_the_local_model_through_its_own_worker(
        local_cluster: tuple[str, dict[str, Proc], Path], tmp_path: Path) -> None:
    api, procs, model_dir = local_cluster
    # Given a file whose lines go to the local model but for a block going to a remote one,
    # and one line that is not JSON
    lines = mixed_lines()
    path = write_jsonl(tmp_path / "mixed.jsonl", [*lines[:5], "not json", *lines[5:]])
    # When it is submitted over REST and runs to the end
    with path.open("rb") as handle:
        job = httpx.post(f"{api}/jobs", files={"file": ("mixed.jsonl", handle)},
                         data={"queue": "bulk"}, timeout=30).raise_for_status().json()
    deadline = time.monotonic() + 240
    while job["status"] == "in_progress":
        assert time.monotonic() < deadline, (job["request_counts"], procs["local"].log())
        time.sleep(0.5)
        job = httpx.get(f"{api}/jobs/{job['id']}", timeout=10).json()
    # Then every request succeeded (a worker without the model would have failed its items)
    assert job["status"] == "completed", procs["local"].log()
    assert job["request_counts"] == {"total": len(lines) + 1, "completed": len(lines),
                                     "failed": 1, "pending": 0, **_rest(job)}
    results = [json.loads(row) for row in
               httpx.get(f"{api}/jobs/{job['id']}/results", timeout=30).text.splitlines()]
    assert [r["custom_id"] for r in results] == [line["custom_id"] for line in lines]
    # And each local answer is the model's, with usage counted from the real tokens
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    by_id = {line["custom_id"]: line for line in lines}
    for result in results:
        request = by_id[result["custom_id"]]["body"]
        body = result["response"]["body"]
        if request["model"] != "tiny":
            assert body["system_fingerprint"] == "quotaflow-simulated"
            continue
        assert body["system_fingerprint"] == "quotaflow-local-transformers"
        assert body["object"] == "chat.completion" and body["model"] == "tiny"
        choice = body["choices"][0]
        assert choice["message"]["content"].strip()
        assert choice["finish_reason"] == "length"
        template = tokenizer.apply_chat_template(request["messages"], tokenize=False,
                                                 add_generation_prompt=True)
        prompt_tokens = len(tokenizer(template, add_special_tokens=False)["input_ids"])
        assert body["usage"] == {"prompt_tokens": prompt_tokens,
                                 "completion_tokens": request["max_tokens"],
                                 "total_tokens": prompt_tokens + request["max_tokens"]}
    # And the local worker took only its own queues' batches, the general one only the rest
    assert _received(procs["local"]) >= 1 and _received(procs["general"]) >= 1
    assert "local.tiny-local.bulk" in _full_log(procs["local"])
    assert "local.tiny-local" not in _full_log(procs["general"])
    # And the local worker's batch runs (10 lines each, three at a time) met in model
    # batches of up to max_batch_size
    sizes = [int(n) for n in re.findall(r"batch of (\d+) generate", _full_log(procs["local"]))]
    assert sum(sizes) == LOCAL_LINES and max(sizes) > 1 and max(sizes) <= 8


def _rest(job: dict) -> dict:
    """Counts beyond the three checked (cancelled, expired, ...), as the job reports them."""
    return {k: v for k, v in job["request_counts"].items()
            if k not in ("total", "completed", "failed", "pending")}


def _full_log(proc: Proc) -> str:
    return proc.log_path.read_text(errors="replace")


def _received(proc: Proc) -> int:
    return _full_log(proc).count("quotaflow.process_batch")


def test_quotaflow_run_loads_the_local_model_in_process(tmp_path: Path) -> None:
    # Given a deployments file with only the local model, and an embeddings file for it
    model_dir = save_tiny_model(tmp_path / "tiny-gpt2")
    deployments = tmp_path / "deployments.toml"
    deployments.write_text(TINY_DEPLOYMENT.format(path=model_dir)
                           + '[routes]\n"*" = "tiny-local"\n')
    texts = [f"{SENTENCES[i % 7]} number {i}" for i in range(12)]
    write_jsonl(tmp_path / "embed.jsonl", [
        {"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "tiny", "input": text}} for i, text in enumerate(texts)])
    env = service_env(QUOTAFLOW_DATABASE_URL=f"sqlite:///{tmp_path / 'embedded.db'}",
                      QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments), HF_HUB_OFFLINE="1",
                      PYTHONPATH=str(ROOT))  # this checkout's code, from another directory
    # When it is run with `quotaflow run`, no broker and no worker
    result = subprocess.run(quotaflow("run", "embed.jsonl", "-o", "out.jsonl"), cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=240)
    # Then every line has its vector, and usage counts the real prompt tokens
    assert result.returncode == 0, result.stderr
    assert "12 succeeded, 0 failed of 12" in result.stderr
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [line["custom_id"] for line in lines] == [f"e{i}" for i in range(12)]
    for line, text in zip(lines, texts, strict=True):
        body = line["response"]["body"]
        assert body["object"] == "list" and len(body["data"][0]["embedding"]) == 32
        assert body["usage"]["prompt_tokens"] == len(tokenizer(text)["input_ids"])


def test_worker_deployment_must_name_a_local_deployment(tmp_path: Path) -> None:
    deployments = tmp_path / "deployments.toml"
    deployments.write_text(TINY_DEPLOYMENT.format(path=tmp_path / "none") + """
[deployments.remote]
provider = "mock"
model = "m"
rpm = 100
tpm = 100000
""")
    env = service_env(QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments),
                      QUOTAFLOW_BROKER_URL=REDIS_URL)
    for name, message in (("nope", "no such deployment in the deployments file"),
                          ("remote", "is a 'mock' deployment; only local deployments")):
        result = subprocess.run(quotaflow("worker", "--deployment", name), env=env,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 78 and message in result.stderr, result.stderr

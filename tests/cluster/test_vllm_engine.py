"""Local deployments on vLLM's engine (`engine = "vllm"`): a real `quotaflow worker
--deployment` under vLLM's interpreter (its CPU build, scripts/vllm-venv) owns one
AsyncLLM, loaded before it takes a batch; jobs of several queues run through it over
real Celery, Redis and PostgreSQL.

One worker for the module (its engine loads in about 50 s on 2 cores) with
max_num_seqs = 4, so requests beyond four wait in vLLM's own queue: that is where
the priority and the abort are seen. The model is the tiny random-weight Llama of
tests/harness/vllm_server.py (a token a byte).
"""

import io
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from transformers import AutoTokenizer

from quotaflow.config import Settings
from quotaflow.db import session_factory
from quotaflow.dispatch.queues import PlacingDispatcher
from quotaflow.ingest import pipeline
from quotaflow.jobs import service as jobs
from quotaflow.models import Item, ItemStatus, Result
from quotaflow.results import output
from tests.harness.cluster import job_status
from tests.harness.factories import jsonl
from tests.harness.procs import Proc
from tests.harness.servers import REDIS_URL, flush_redis
from tests.harness.vllm_server import engine_env, start_engine_worker, write_model
from workers.dispatch import CeleryDispatcher

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

DEPLOYMENT = "tiny-vllm"
POOLING = "tiny-vllm-pooling"
MAX_NUM_SEQS = 4


def deployments_toml(model_dir: Path, name: str = DEPLOYMENT) -> str:
    return (f'[deployments.{name}]\nprovider = "local"\nengine = "vllm"\n'
            f'model = "tiny"\nmodel_path = "{model_dir}"\ndtype = "bfloat16"\n'
            f"max_model_len = 512\nmax_num_seqs = {MAX_NUM_SEQS}\nenforce_eager = true\n"
            "rpm = 1000000\ntpm = 100000000\nmax_concurrency = 64\ndefault_temperature = 0\n"
            f'[routes]\n"tiny" = "{name}"\n')


@dataclass
class Engine:
    worker: Proc
    sessions: sessionmaker[Session]
    settings: Settings
    model_dir: Path


@pytest.fixture(scope="module")
def engine(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    workdir = tmp_path_factory.mktemp("vllm-engine")
    model_dir = write_model(workdir / "model")
    path = workdir / "deployments.toml"
    path.write_text(deployments_toml(model_dir))
    flush_redis(REDIS_URL)
    env = engine_env(workdir, QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                     QUOTAFLOW_DEPLOYMENTS_FILE=str(path))
    worker = start_engine_worker(env, workdir, DEPLOYMENT, concurrency=3)
    settings = Settings(database_url=pg_url, broker_url=REDIS_URL, batch_size=50,
                        deployments_file=path, _env_file=None)
    try:
        yield Engine(worker, session_factory(pg_url), settings, model_dir)
    finally:
        worker.stop()


def chat(custom_id: str, text: str, max_tokens: int) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "tiny", "max_tokens": max_tokens,
                     "messages": [{"role": "user", "content": text}]}}


def submit(engine: Engine, lines: list[dict], queue: str) -> str:
    deployments = engine.settings.load_deployments()
    dispatcher = PlacingDispatcher(CeleryDispatcher(REDIS_URL), engine.sessions, deployments)
    return pipeline.create_job_in_process(
        engine.sessions, io.BytesIO(jsonl(lines)), settings=engine.settings,
        deployments=deployments, dispatcher=dispatcher, queue=queue).id


def results(engine: Engine, job_id: str) -> list[Result]:
    with engine.sessions() as session:
        return list(session.scalars(select(Result).where(Result.job_id == job_id)
                                    .order_by(Result.line_no)))


def _running(engine: Engine, job_id: str) -> int:
    with engine.sessions() as session:
        return session.scalar(select(func.count()).select_from(Item).where(
            Item.job_id == job_id, Item.status == ItemStatus.RUNNING)) or 0


def wait_done(engine: Engine, job_id: str, timeout: float = 180, every: float = 0.3) -> str:
    deadline = time.monotonic() + timeout
    while (status := job_status(engine.sessions, job_id)) in ("in_progress", "cancelling"):
        assert time.monotonic() < deadline, engine.worker.log()
        time.sleep(every)
    return status


def test_jobs_of_two_queues_run_on_one_engine_with_real_usage(engine: Engine) -> None:
    # Given a chat job and a completions job, on two queues, at once
    chats = [chat(f"c{i}", f"question {i} about the tide", 6 + i % 5) for i in range(12)]
    prompts = [{"custom_id": f"p{i}", "method": "POST", "url": "/v1/completions",
                "body": {"model": "tiny", "max_tokens": 8, "prompt": f"the harbour {i}"}}
               for i in range(12)]
    first = submit(engine, chats, "standard")
    second = submit(engine, prompts, "bulk")
    # When both have run
    assert wait_done(engine, first) == "completed", engine.worker.log()
    assert wait_done(engine, second) == "completed", engine.worker.log()
    # Then every answer is the engine's, named in system_fingerprint, with usage counted
    # on the model's tokenizer (prompt) and vLLM's tokens (completion, at most max_tokens)
    tokenizer = AutoTokenizer.from_pretrained(engine.model_dir)
    with engine.sessions() as session:
        answers = {json.loads(row)["custom_id"]: json.loads(row)["response"]["body"]
                   for job in (first, second) for row in output.iter_output(session, job, False)}
    assert len(answers) == 24
    for line in chats + prompts:
        body, request = answers[line["custom_id"]], line["body"]
        assert body["system_fingerprint"] == "quotaflow-local-vllm"
        if "messages" in request:
            text = tokenizer.apply_chat_template(request["messages"], tokenize=False,
                                                 add_generation_prompt=True)
            prompt = len(tokenizer(text, add_special_tokens=False)["input_ids"])
            assert body["object"] == "chat.completion"
        else:
            prompt = len(tokenizer(request["prompt"])["input_ids"])
            assert body["object"] == "text_completion"
        usage, choice = body["usage"], body["choices"][0]
        assert usage["prompt_tokens"] == prompt
        assert 1 <= usage["completion_tokens"] <= request["max_tokens"]
        assert (choice["finish_reason"] == "length") == (
            usage["completion_tokens"] == request["max_tokens"])
    # And the two jobs' requests were in the engine at the same time: one continuous batch
    spans = {job: [(r.sent_at, r.answered_at) for r in results(engine, job)]
             for job in (first, second)}
    overlapping = sum(1 for a_sent, a_done in spans[first] for b_sent, b_done in spans[second]
                      if a_sent < b_done and b_sent < a_done)
    assert overlapping > 0, spans


def test_realtime_requests_go_ahead_of_bulk_waiting_in_the_engine(engine: Engine) -> None:
    # Given a bulk job of 50 long requests, all sent into the engine at once (one batch,
    # max_concurrency 64) where only MAX_NUM_SEQS run at a time
    bulk = submit(engine, [chat(f"b{i}", f"bulk request {i}", 256) for i in range(50)], "bulk")
    deadline = time.monotonic() + 60
    while not any(r.answered_at for r in results(engine, bulk)):
        assert time.monotonic() < deadline, engine.worker.log()
        time.sleep(0.1)
    # When a realtime job of four arrives while most of the bulk ones still wait
    realtime = submit(engine, [chat(f"r{i}", f"urgent {i}", 8) for i in range(4)], "realtime")
    assert wait_done(engine, realtime) == "completed", engine.worker.log()
    assert wait_done(engine, bulk) == "completed", engine.worker.log()
    # Then the realtime requests finished before the bulk requests that were waiting in
    # the engine when they were sent (first come, first served would put them last)
    urgent = results(engine, realtime)
    sent = min(r.sent_at for r in urgent)
    done = max(r.answered_at for r in urgent)
    waiting = [r for r in results(engine, bulk) if r.sent_at < sent and r.answered_at > sent]
    bulk_rows = results(engine, bulk)
    assert len(waiting) > 2 * MAX_NUM_SEQS, (
        "the bulk job ended too soon to compare: realtime sent at "
        f"{sent}, bulk sent {min(r.sent_at for r in bulk_rows)}-"
        f"{max(r.sent_at for r in bulk_rows)}, answered {min(r.answered_at for r in bulk_rows)}"
        f"-{max(r.answered_at for r in bulk_rows)}, realtime answered {done}")
    after = [r for r in waiting if r.answered_at > done]
    assert len(after) >= len(waiting) - 2 * MAX_NUM_SEQS, (
        f"{len(waiting) - len(after)} of {len(waiting)} waiting bulk requests finished "
        "before the realtime ones")


def test_cancelling_a_job_aborts_its_requests_in_the_engine(engine: Engine) -> None:
    # Given a bulk job whose requests wait in the engine (only MAX_NUM_SEQS run)
    # (400 tokens each: ten rounds of MAX_NUM_SEQS take seconds, not one)
    job = submit(engine, [chat(f"x{i}", f"long request {i}", 400) for i in range(40)], "bulk")
    deadline = time.monotonic() + 60
    # (claimed, then half a second to reach the engine: answers are stored a chunk at a
    # time, so waiting for the first stored one could find the job all but done)
    while not _running(engine, job):
        assert time.monotonic() < deadline, engine.worker.log()
        time.sleep(0.05)
    time.sleep(0.5)
    log_before = len(engine.worker.log_path.read_text(errors="replace"))
    # When it is cancelled
    asked = time.monotonic()
    jobs.cancel_job(engine.sessions, job)
    # Then within 2 s the job has ended, its waiting requests aborted in vLLM (not run to
    # their 400 tokens) and their items cancelled. Timed by the job's own record, from
    # the cancel (cancelling_at, set in its transaction) to the worker ending the job
    # (cancelled_at): a late poll by the test is not counted against the product.
    status = wait_done(engine, job, timeout=10, every=0.05)
    seen = time.monotonic() - asked
    log = engine.worker.log_path.read_text(errors="replace")[log_before:]
    assert status == "cancelled", (status, log[-6000:])
    with engine.sessions() as session:
        record = jobs.get_job(session, job)
    assert record.cancelling_at is not None and record.cancelled_at is not None
    took = (record.cancelled_at - record.cancelling_at).total_seconds()
    aborts = [line[:23] for line in log.splitlines() if "aborted in vLLM" in line]
    assert took < 2.0, (
        f"ended {took:.2f} s after the cancel ({seen:.2f} s as the test saw it); "
        f"cancelling_at {record.cancelling_at}, cancelled_at {record.cancelled_at}; "
        f"{len(aborts)} aborts logged from {aborts[:1]} to {aborts[-1:]}; the worker's "
        f"log since:\n{log[-6000:]}")
    aborted = len(aborts)
    with engine.sessions() as session:
        errors = [json.loads(row) for row in output.iter_output(session, job, True)]
    codes = [e["error"]["code"] for e in errors]
    assert aborted >= 20 and codes.count("batch_cancelled") >= 20, (aborted, codes)


def _answers(engine: Engine, job_id: str) -> dict[str, dict]:
    with engine.sessions() as session:
        return {row["custom_id"]: row["response"]["body"] for row in (
            json.loads(line) for line in output.iter_output(session, job_id, False))}


def _stop_in(text: str) -> str | None:
    """Two printable ASCII characters first seen after the start of `text`."""
    for at in range(1, len(text) - 1):
        piece = text[at:at + 2]
        if piece.isascii() and piece.isprintable() and text.index(piece) == at:
            return piece
    return None


def test_stop_sequences_and_seeds_reach_the_engine(engine: Engine) -> None:
    # Given greedy answers (the deployment's default temperature is 0)
    greedy = submit(engine, [chat(f"g{i}", f"the tide and the moon {i}", 32)
                             for i in range(6)], "standard")
    assert wait_done(engine, greedy) == "completed", engine.worker.log()
    texts = {k: b["choices"][0]["message"]["content"] for k, b in _answers(engine, greedy).items()}
    key, stop = next((k, _stop_in(t)) for k, t in sorted(texts.items()) if _stop_in(t))
    text = texts[key]
    # When the same line asks to stop at two characters of that answer, and lines sample
    # at temperature 1 with a seed (two with the same seed, one with another)
    line = chat("stopped", f"the tide and the moon {key[1:]}", 32)
    line["body"]["stop"] = [stop]
    sampled = []
    for custom_id, seed in (("s11a", 11), ("s11b", 11), ("s12", 12)):
        sampled.append(chat(custom_id, "draw a sample", 24))
        sampled[-1]["body"].update(temperature=1, seed=seed)
    job = submit(engine, [line, *sampled], "standard")
    assert wait_done(engine, job) == "completed", engine.worker.log()
    answers = _answers(engine, job)
    # Then the answer ends where the stop sequence began, for that reason
    choice = answers["stopped"]["choices"][0]
    assert choice["message"]["content"] == text[:text.index(stop)], (text, stop, choice)
    assert choice["finish_reason"] == "stop"
    # and a seed draws the same sample each time, another seed another
    content = {k: answers[k]["choices"][0]["message"]["content"] for k in ("s11a", "s11b", "s12")}
    assert content["s11a"] == content["s11b"] != content["s12"], content


def test_a_pooling_deployment_serves_embeddings(pg_url: str, tmp_path: Path) -> None:
    # Given a second deployment of the same model on vLLM's pooling runner, and its worker
    model_dir = write_model(tmp_path / "model")
    path = tmp_path / "deployments.toml"
    # A name of its own: its queues are not the module worker's, which is still running.
    path.write_text(deployments_toml(model_dir, POOLING).replace(
        "enforce_eager = true\n", 'enforce_eager = true\nrunner = "pooling"\n'))
    env = engine_env(tmp_path, QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                     QUOTAFLOW_DEPLOYMENTS_FILE=str(path))
    worker = start_engine_worker(env, tmp_path, POOLING, concurrency=2)
    try:
        settings = Settings(database_url=pg_url, broker_url=REDIS_URL, batch_size=50,
                            deployments_file=path, _env_file=None)
        pooling = Engine(worker, session_factory(pg_url), settings, model_dir)
        texts = ["the tide comes in", "a question about the moon", "how many boats"]
        lines = [{"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
                  "body": {"model": "tiny", "input": text}} for i, text in enumerate(texts)]
        job = submit(pooling, lines, "standard")
        refused = submit(pooling, [chat("chat", "hello", 4)], "standard")
        # When they have run
        assert wait_done(pooling, job) == "completed", worker.log()
        assert wait_done(pooling, refused) == "completed", worker.log()
        with pooling.sessions() as session:
            answered = [json.loads(row) for row in output.iter_output(session, job, False)]
            failed = [json.loads(row) for row in output.iter_output(session, refused, True)]
    finally:
        worker.stop()
    # Then each text has its normalised vector, with its prompt tokens counted
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert [a["custom_id"] for a in answered] == ["e0", "e1", "e2"]
    for answer, text in zip(answered, texts, strict=True):
        body = answer["response"]["body"]
        (vector,) = [d["embedding"] for d in body["data"]]
        assert len(vector) == 128 and sum(x * x for x in vector) == pytest.approx(1, abs=1e-3)
        assert body["usage"]["prompt_tokens"] == len(tokenizer(text)["input_ids"])
    # and a chat line, which a pooling model cannot answer, failed with a 400
    (error,) = failed
    assert error["custom_id"] == "chat" and error["response"]["status_code"] == 400, error
    assert "does not support generation" in error["error"]["message"], error

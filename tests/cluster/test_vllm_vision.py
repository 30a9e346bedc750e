"""A vision-language model on vLLM's engine, through a real `quotaflow worker --deployment`
under vLLM's interpreter (its CPU build): `image_url` parts as base64 data URLs reach the
model, and its answer depends on the image. The model is the tiny random-weight BLIP-2 of
tests/harness/tiny_vlm.py, written at test time."""

import base64
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image
from transformers import AutoTokenizer

from quotaflow.config import Settings
from quotaflow.db import session_factory
from quotaflow.dispatch.queues import PlacingDispatcher
from quotaflow.ingest import pipeline
from quotaflow.results import output
from tests.harness.cluster import job_status
from tests.harness.factories import jsonl
from tests.harness.procs import Proc
from tests.harness.servers import REDIS_URL, flush_redis
from tests.harness.tiny_vlm import CHAT_TEMPLATE, QUERY_TOKENS, save_tiny_vlm
from tests.harness.vllm_server import engine_env, start_engine_worker
from workers.dispatch import CeleryDispatcher

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

DEPLOYMENT = "tiny-vlm"
QUESTION = "what is in the picture?"


def png_data_url(colour: tuple[int, int, int]) -> str:
    picture = io.BytesIO()
    Image.new("RGB", (40, 30), colour).save(picture, format="PNG")
    return "data:image/png;base64," + base64.b64encode(picture.getvalue()).decode()


def line(custom_id: str, colour: tuple[int, int, int]) -> dict:
    content = [{"type": "text", "text": QUESTION},
               {"type": "image_url", "image_url": {"url": png_data_url(colour)}}]
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "vlm", "max_tokens": 4, "logprobs": True, "top_logprobs": 2,
                     "messages": [{"role": "user", "content": content}]}}


@pytest.fixture(scope="module")
def worker(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        tuple[Proc, Settings, Path]]:
    workdir = tmp_path_factory.mktemp("vllm-vision")
    model_dir = save_tiny_vlm(workdir / "model")
    path = workdir / "deployments.toml"
    path.write_text(f'[deployments.{DEPLOYMENT}]\nprovider = "local"\nengine = "vllm"\n'
                    f'model = "vlm"\nmodel_path = "{model_dir}"\ndtype = "float32"\n'
                    "max_model_len = 512\nenforce_eager = true\nrpm = 1000000\n"
                    "tpm = 100000000\ndefault_temperature = 0\n")
    flush_redis(REDIS_URL)
    env = engine_env(workdir, QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                     QUOTAFLOW_DEPLOYMENTS_FILE=str(path))
    proc = start_engine_worker(env, workdir, DEPLOYMENT, concurrency=2)
    settings = Settings(database_url=pg_url, broker_url=REDIS_URL, batch_size=50,
                        deployments_file=path, _env_file=None)
    try:
        yield proc, settings, model_dir
    finally:
        proc.stop()


def test_an_image_url_line_is_answered_from_its_image(
        worker: tuple[Proc, Settings, Path], pg_url: str) -> None:
    proc, settings, model_dir = worker
    sessions = session_factory(pg_url)
    # Given lines asking the same question of a red picture (twice) and of a green one
    lines = [line("red", (200, 30, 30)), line("green", (10, 200, 90)),
             line("red-again", (200, 30, 30))]
    deployments = settings.load_deployments()
    dispatcher = PlacingDispatcher(CeleryDispatcher(REDIS_URL), sessions, deployments)
    job = pipeline.create_job_in_process(sessions, io.BytesIO(jsonl(lines)), settings=settings,
                                         deployments=deployments, dispatcher=dispatcher,
                                         queue="standard").id
    # When they have run through the worker
    deadline = time.monotonic() + 300
    while (status := job_status(sessions, job)) == "in_progress":
        assert time.monotonic() < deadline, proc.log()
        time.sleep(0.3)
    with sessions() as session:
        failed = list(output.iter_output(session, job, True))
        answers = {row["custom_id"]: row["response"]["body"] for row in (
            json.loads(text) for text in output.iter_output(session, job, False))}
    assert status == "completed" and not failed, (status, failed, proc.log())
    # Then each prompt counts the image's tokens (the Q-Former's queries) beside the text
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION}], chat_template=CHAT_TEMPLATE, tokenize=False,
        add_generation_prompt=True)
    prompt = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    assert all(a["usage"]["prompt_tokens"] == prompt + QUERY_TOKENS
               for a in answers.values()), answers
    # and the answer is the image's: the same picture gets the same tokens and log
    # probabilities, another picture others (the text of the three prompts is the same)
    seen = {key: [(t["token"], round(t["logprob"], 4))
                  for t in a["choices"][0]["logprobs"]["content"]] for key, a in answers.items()}
    assert seen["red"] == seen["red-again"] != seen["green"], seen


def test_an_anthropic_image_block_reaches_the_model(worker: tuple[Proc, Settings, Path],
                                                    pg_url: str) -> None:
    proc, settings, model_dir = worker
    sessions = session_factory(pg_url)
    # Given an Anthropic Message Batches line with a base64 image block
    data = png_data_url((200, 30, 30)).split(",", 1)[1]
    params = {"model": "vlm", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "text", "text": QUESTION},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": data}}]}]}
    deployments = settings.load_deployments()
    dispatcher = PlacingDispatcher(CeleryDispatcher(REDIS_URL), sessions, deployments)
    job = pipeline.create_job_in_process(
        sessions, io.BytesIO(jsonl([{"custom_id": "anthropic", "params": params}])),
        settings=settings, deployments=deployments, dispatcher=dispatcher,
        queue="standard").id
    deadline = time.monotonic() + 300
    while (status := job_status(sessions, job)) == "in_progress":
        assert time.monotonic() < deadline, proc.log()
        time.sleep(0.3)
    with sessions() as session:
        rows = [json.loads(text) for text in output.iter_output(session, job, False)]
    # Then it was answered, its prompt counting the image's tokens beside the text
    assert status == "completed" and len(rows) == 1, (status, rows, proc.log())
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": QUESTION}], chat_template=CHAT_TEMPLATE, tokenize=False,
        add_generation_prompt=True)
    prompt = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    assert f'"input_tokens": {prompt + QUERY_TOKENS}' in json.dumps(rows[0]), rows[0]

"""A real vLLM server behind an ordinary `provider = "openai"` deployment: a job of OpenAI
batch lines runs through real Celery workers, and every line comes back in OpenAI's
output-line shape with usage as vLLM counted it, the limiter charged exactly that, vLLM's
x-request-id as the answer's request_id, and the requests vLLM refuses (a prompt past the
context, bad sampling parameters) failed with vLLM's own message, nothing else touched.

One server for the module (tests/harness/vllm_server.py; about 30 s to start on 2 cores) and one
job per endpoint, read by each test. The lines are `lines()` (what real files send,
and the endpoint's edge cases) and the shared conformance set's OpenAI lines of the
endpoints vLLM serves (`conformance_lines()`); the checks
(tests/harness/openai_answers.py) read what to expect from each line.
"""

import io
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.budget.buckets import RedisLimiter, bucket_key
from quotaflow.budget.limiter import Settlement
from quotaflow.config import Settings
from quotaflow.constants import ENDPOINT_CHAT, ENDPOINT_COMPLETIONS, ENDPOINTS
from quotaflow.db import session_factory
from quotaflow.deployments.limits import Budget
from quotaflow.ingest import pipeline
from quotaflow.jobs import service as jobs
from quotaflow.jobs import view as job_view
from quotaflow.models import Result
from quotaflow.results import output
from tests.harness import conformance
from tests.harness.cluster import start_workers
from tests.harness.factories import jsonl
from tests.harness.openai_answers import ENDPOINT_RESPONSES, check_answered, check_refused
from tests.harness.servers import REDIS_URL, service_env
from tests.harness.vllm_server import MAX_MODEL_LEN, start_vllm
from workers.dispatch import CeleryDispatcher

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(400)]

MODEL = "tiny"  # the name vLLM serves; the deployment puts it on every request
REFUSED = "tiny-refusals"  # lines for the second deployment on the same server
TPM = 60_000
# Spent before the job, so the job's tokens bucket never refills to its ceiling (where a
# refund would be cut) and the limiter check below is exact.
SPENT_BEFORE = 54_000


def _line(custom_id: str, url: str, **body: object) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url,
            "body": {"model": MODEL, **body}}


def lines() -> list[dict]:
    """OpenAI batch lines vLLM answers: every endpoint it serves that quotaflow takes
    (/v1/responses once quotaflow accepts it), and what real files send."""
    weather = {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"enum": ["Oslo", "Lima"]}},
                       "required": ["city"], "additionalProperties": False}}}
    asked = [{"role": "user", "content": "what is the weather in Oslo?"}]
    chosen = [{"id": "call_1", "type": "function",
               "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]
    found = [
        _line("chat-system", ENDPOINT_CHAT, max_tokens=12, messages=[
            {"role": "system", "content": "You answer in one short line."},
            {"role": "user", "content": "what is the weather like on the coast in winter"}]),
        _line("chat-turns", ENDPOINT_CHAT, max_tokens=12, temperature=0.7, top_p=0.9, messages=[
            {"role": "user", "content": "tell me a short story about a lighthouse keeper"},
            {"role": "assistant", "content": "once there was a keeper"},
            {"role": "user", "content": "and then?"}]),
        _line("chat-stop", ENDPOINT_CHAT, max_tokens=48, seed=5, stop=[" ", "e", "\n"],
              messages=[{"role": "user", "content": "the quick brown fox"}]),
        _line("chat-n", ENDPOINT_CHAT, max_tokens=6, n=2,
              messages=[{"role": "user", "content": "two answers, please"}]),
        _line("chat-seed", ENDPOINT_CHAT, max_tokens=16, seed=1234, temperature=1.0,
              messages=[{"role": "user", "content": "a number question"}]),
        _line("chat-json", ENDPOINT_CHAT, max_tokens=96, seed=2, response_format={
            "type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": {
                "type": "object", "properties": {"ok": {"type": "boolean"},
                                                 "count": {"type": "integer"}},
                "required": ["ok", "count"], "additionalProperties": False}}},
              messages=[{"role": "user", "content": "answer in JSON"}]),
        _line("chat-tool", ENDPOINT_CHAT, max_tokens=96, seed=3, tools=[weather],
              tool_choice={"type": "function", "function": {"name": "get_weather"}},
              messages=asked),
        _line("chat-tool-result", ENDPOINT_CHAT, max_tokens=12, tools=[weather], messages=[
            *asked, {"role": "assistant", "content": None, "tool_calls": chosen},
            {"role": "tool", "tool_call_id": "call_1", "content": "rain, 4 degrees"}]),
        _line("completion", ENDPOINT_COMPLETIONS, max_tokens=12, prompt="the tide comes in"),
        _line("completion-prompts", ENDPOINT_COMPLETIONS, max_tokens=6, seed=9,
              prompt=["how many boats", "are in the harbour"]),
    ]
    if ENDPOINT_RESPONSES in ENDPOINTS:
        found += [
            _line("response", ENDPOINT_RESPONSES, max_output_tokens=12,
                  input="summarise the report about river levels"),
            _line("response-instructions", ENDPOINT_RESPONSES, max_output_tokens=12,
                  instructions="Answer briefly.", input=asked)]
    return found


# The conformance set's OpenAI-format files of the endpoints this server serves
# (embeddings need an embedding model, moderations a classifier: neither is this one).
CONFORMANCE_FILES = ("chat_openai", "completions_openai", "responses_openai")
# The output ceiling of a conformance line here: a random-weight model rarely says EOS,
# and each token is a decoding step on the CPU.
CONFORMANCE_MAX_TOKENS = 16
_CEILINGS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
# Conformance lines this model refuses, with vLLM's status and words: the set's
# logit_bias names token ids of OpenAI's tokenizers, past the tiny model's byte vocabulary.
CONFORMANCE_REFUSED = {"o-logit-bias": (400, "token_id(s)")}


def conformance_lines(refused: bool = False) -> list[dict]:
    """The conformance set's OpenAI lines for this server's endpoints, as written but for
    the model and a lower output ceiling: those it answers, or (`refused`) those it
    refuses, which go to the refusals' deployment. Lines with images or files are left
    out: the tiny model reads text only (a vision model's server answers them)."""
    found = []
    for name in CONFORMANCE_FILES:
        for entry in conformance.lines(name):
            line = json.loads(json.dumps(entry["line"]))
            if _has_media(line["body"]) or (entry["name"] in CONFORMANCE_REFUSED) != refused:
                continue
            body = line["body"]
            body["model"] = REFUSED if refused else MODEL
            ceiling = next((key for key in _CEILINGS if key in body),
                           "max_output_tokens" if line["url"] == ENDPOINT_RESPONSES
                           else "max_tokens")
            body[ceiling] = min(int(body.get(ceiling, CONFORMANCE_MAX_TOKENS)),
                                CONFORMANCE_MAX_TOKENS)
            line["custom_id"] = f"conformance-{entry['name']}"
            found.append(line)
    return found


def _has_media(value: object) -> bool:
    if isinstance(value, dict):
        return value.get("type") in ("image_url", "input_image", "file", "input_file") or any(
            _has_media(v) for v in value.values())
    return isinstance(value, list) and any(_has_media(v) for v in value)


def answered_lines() -> list[dict]:
    return lines() + conformance_lines()


def refused_lines() -> list[tuple[dict, int, str]]:
    """Lines vLLM refuses, each with its status and the words of vLLM's message."""
    def refused(custom_id: str, url: str, **body: object) -> dict:
        line = _line(custom_id, url, **body)
        line["body"]["model"] = REFUSED
        return line
    too_long = "x" * (MAX_MODEL_LEN + 100)  # a token a byte
    from_the_set = [(line, *CONFORMANCE_REFUSED[line["custom_id"].removeprefix(
        "conformance-")]) for line in conformance_lines(refused=True)]
    return [*from_the_set,
        (refused("too-long", ENDPOINT_CHAT, max_tokens=8,
                 messages=[{"role": "user", "content": too_long}]),
         400, f"maximum context length is {MAX_MODEL_LEN} tokens"),
        (refused("cold", ENDPOINT_CHAT, max_tokens=8, temperature=-1,
                 messages=[{"role": "user", "content": "hi"}]),
         400, "temperature must be non-negative"),
        (refused("no-choices", ENDPOINT_CHAT, max_tokens=8, n=0,
                 messages=[{"role": "user", "content": "hi"}]),
         400, "n must be at least 1"),
        (refused("too-many-tokens", ENDPOINT_COMPLETIONS, max_tokens=MAX_MODEL_LEN + 1,
                 prompt="hi"),
         400, f"cannot be greater than max_model_len={MAX_MODEL_LEN}"),
    ]


def deployments_toml(url: str) -> str:
    """Two deployments of one server: the refused lines spend a budget of their own, so
    the first one's limiter holds exactly what vLLM counted for the answered lines (a
    route per model: both deployments serve MODEL, and a model's own route would be both).
    vLLM sends no rate-limit headers to learn refunds from: reconcile_usage = true."""
    return (f'[deployments.vllm]\nprovider = "openai"\nbase_url = "{url}/v1"\n'
            f'model = "{MODEL}"\nrpm = 60000\ntpm = {TPM}\nsafety_margin_s = 0\n'
            f'reconcile_usage = true\nmax_concurrency = 32\n'
            f'[deployments.vllm-refusals]\nprovider = "openai"\nbase_url = "{url}/v1"\n'
            f'model = "{MODEL}"\nrpm = 60000\ntpm = 1000000\n'
            f'[routes]\n"{MODEL}" = "vllm"\n"{REFUSED}" = "vllm-refusals"\n"*" = "vllm"\n')


@dataclass
class Finished:
    views: list[dict]  # one job per endpoint: a file holds one endpoint's lines
    outputs: dict[str, dict]  # custom_id -> output or error line
    usage: dict[str, tuple[int, int]]  # custom_id -> (prompt, completion) as stored
    bucket_before: dict[str, float]
    bucket_after: dict[str, float]


def _bucket(client: redis.Redis, budget: Budget) -> dict[str, float]:
    return {k.decode(): float(v) for k, v in client.hgetall(bucket_key(budget.name)).items()}


def run_jobs(sessions: sessionmaker[Session], settings: Settings, sent: list[dict],
             timeout: float = 120) -> list[dict]:
    """One job per endpoint, all queued at once on the Celery workers; their views once
    every one has finished."""
    by_url: dict[str, list[dict]] = {}
    for line in sent:
        by_url.setdefault(line["url"], []).append(line)
    ids = [pipeline.create_job_in_process(
        sessions, io.BytesIO(jsonl(group)), settings=settings,
        deployments=settings.load_deployments(), dispatcher=CeleryDispatcher(settings.broker_url),
        queue="realtime").id for group in by_url.values()]
    deadline = time.monotonic() + timeout
    while True:
        with sessions() as session:
            views = [job_view.job_object(session, jobs.get_job(session, id_)) for id_ in ids]
        if all(view["status"] != "in_progress" for view in views):
            return views
        assert time.monotonic() < deadline, [view["request_counts"] for view in views]
        time.sleep(0.3)


@pytest.fixture(scope="module")
def finished(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Finished]:
    workdir = tmp_path_factory.mktemp("vllm")
    server = start_vllm(workdir, MODEL)
    url = next(server)
    client = redis.Redis.from_url(REDIS_URL)
    workers = []
    try:
        client.flushdb()
        path = workdir / "deployments.toml"
        path.write_text(deployments_toml(url))
        env = service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                          QUOTAFLOW_DEPLOYMENTS_FILE=str(path))
        workers = start_workers(env, workdir, "vllm")
        settings = Settings(database_url=pg_url, broker_url=REDIS_URL, batch_size=8,
                            deployments_file=path, _env_file=None)
        budget = (settings.load_deployments().deployments["vllm"]).budget
        limiter = RedisLimiter(REDIS_URL)
        spent = limiter.acquire(budget, [SPENT_BEFORE], 0.0)
        limiter.settle(budget, [Settlement(spent.slot, SPENT_BEFORE, 0.0)])
        before = _bucket(client, budget)
        limiter.close()
        sessions = session_factory(pg_url)
        views = run_jobs(sessions, settings,
                         answered_lines() + [line for line, *_ in refused_lines()])
        after = _bucket(client, budget)
        with sessions() as session:
            found = [json.loads(row) for view in views for errors in (False, True)
                     for row in output.iter_output(session, view["id"], errors)]
            usage = {row.custom_id: (row.prompt_tokens, row.completion_tokens)
                     for row in session.scalars(select(Result).where(
                         Result.job_id.in_([view["id"] for view in views])))}
        yield Finished(views, {line["custom_id"]: line for line in found}, usage, before,
                       after)
    finally:
        for worker in workers:
            worker.stop()
        client.close()
        server.close()


def test_every_line_is_answered_in_openai_shape(finished: Finished) -> None:
    # Given the job of representative lines and the lines vLLM refuses, run on Celery
    # workers against the vLLM server
    good, refused = answered_lines(), refused_lines()
    # Then each good line's answer is what it asked for, with vLLM's usage stored for it
    problems = []
    for line in good:
        try:
            counted = check_answered(line, finished.outputs[line["custom_id"]], MODEL)
            assert finished.usage[line["custom_id"]] == counted, line["custom_id"]
        except AssertionError as exc:
            problems.append(f"{line['custom_id']}: {str(exc)[:300]}")
    assert problems == [], "\n".join(problems)
    # and the jobs completed, every refused line failed and nothing else
    assert [view["status"] for view in finished.views] == ["completed"] * len(finished.views)
    counts = [view["request_counts"] for view in finished.views]
    assert (sum(c["total"] for c in counts), sum(c["completed"] for c in counts),
            sum(c["failed"] for c in counts)) == (
        len(good) + len(refused), len(good), len(refused)), counts
    assert len(finished.outputs) == len(good) + len(refused)


def test_the_refused_lines_fail_with_vllms_message(finished: Finished) -> None:
    for line, status, message in refused_lines():
        check_refused(finished.outputs[line["custom_id"]], status, message)


def test_the_response_request_id_is_vllms_x_request_id(finished: Finished) -> None:
    # vLLM (--enable-request-id-headers) answers each request with an x-request-id of
    # its own, a uuid4 in hex; the output line's `id` is quotaflow's
    ids = [(out["id"], out["response"]["request_id"]) for out in finished.outputs.values()
           if out["error"] is None]
    for ours, theirs in ids:
        assert theirs != ours and re.fullmatch("[0-9a-f]{32}", theirs), (ours, theirs)
    assert len({theirs for _, theirs in ids}) == len(ids)


def test_the_limiter_holds_what_vllm_counted(finished: Finished) -> None:
    # The tokens bucket refills at TPM / 60 a second from its level before the job;
    # admission took each line's estimate and the settlements turned it into what vLLM
    # counted (the estimate is characters / 4; vLLM's tokenizer is a token a byte).
    before, after = finished.bucket_before, finished.bucket_after
    refill = TPM / 60 * (after["ts"] - before["ts"])
    assert before["t"] + refill < TPM, "the bucket refilled to its ceiling: job too slow"
    counted = sum(sum(finished.usage[line["custom_id"]]) for line in answered_lines())
    assert before["t"] + refill - after["t"] == pytest.approx(counted, abs=0.01)
    # and the estimates admitted were not that: the settlements made the difference
    assert after["a"] - before["a"] != pytest.approx(counted, abs=0.01)

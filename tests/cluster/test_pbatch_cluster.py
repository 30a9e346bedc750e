"""Provider batch APIs end to end: an `openai-batch` deployment uploading to a second
quotaflow's /v1/files + /v1/batches, `anthropic-batch` deployments at a mock of
Anthropic's Message Batches; results stored once, in order, at the batch price; cancel
passed on; failed and expired lines falling back to realtime; a worker SIGKILLed while
its provider batch is out."""

import json
from collections.abc import Iterator

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.jobs import service as jobs
from quotaflow.models import Item, Job, Result, Spend
from quotaflow.offload.clients import OpenAIBatches
from quotaflow.results import output
from tests.harness.cluster import one_result_per_line
from tests.harness.pbatch_cluster import (
    BATCH_IN,
    BATCH_OUT,
    REALTIME_IN,
    REALTIME_OUT,
    Cluster,
    start,
)

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def cluster(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield from start(pg_url, tmp_path_factory.mktemp("pbatch"))


def openai_line(i: int, model: str = "up-model", text: str = "") -> dict:
    return {"custom_id": f"o{i}", "method": "POST", "url": CHAT,
            "body": {"model": model, "max_tokens": 20,
                     "messages": [{"role": "user", "content": f"question {i} {text}"}]}}


def anthropic_line(i: int, model: str, text: str = "") -> dict:
    return {"custom_id": f"a{i}", "params": {
        "model": model, "max_tokens": 20,
        "messages": [{"role": "user", "content": f"question {i} {text}"}]}}


def output_lines(sessions: sessionmaker[Session], job_id: str, errors: bool = False) -> list:
    with sessions() as session:
        return [json.loads(line) for line in output.iter_output(session, job_id, errors)]


def deployments_of(sessions: sessionmaker[Session], job_id: str) -> dict[str | None, int]:
    with sessions() as session:
        return dict(session.execute(select(Result.deployment, func.count())
                                    .where(Result.job_id == job_id)
                                    .group_by(Result.deployment)).all())


def spend_of(sessions: sessionmaker[Session], job_id: str) -> dict[str, Spend]:
    with sessions() as session:
        return {row.deployment: row for row in session.scalars(
            select(Spend).where(Spend.job_id == job_id))}


def test_openai_batch_through_an_upstream_quotaflow(cluster: Cluster,
                                                    pg_sessions: sessionmaker[Session],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [openai_line(i) for i in range(30)]
    job_id = cluster.submit(pg_sessions, lines)
    assert cluster.wait(pg_sessions, job_id) == "completed"
    assert one_result_per_line(pg_sessions, job_id) == (30, 30)
    assert deployments_of(pg_sessions, job_id) == {"obatch": 30}
    got = output_lines(pg_sessions, job_id)
    assert [line["custom_id"] for line in got] == [f"o{i}" for i in range(30)]
    for i, line in enumerate(got):
        body = line["response"]["body"]
        assert line["error"] is None and line["response"]["status_code"] == 200
        assert body["object"] == "chat.completion" and f"question {i}" in \
            body["choices"][0]["message"]["content"]
        assert body["usage"]["prompt_tokens"] > 0 and body["usage"]["completion_tokens"] > 0
    # One upstream batch of all 30 lines; usage and cost at the batch price.
    with cluster.up_sessions() as session:
        upstream = session.execute(select(Job.id, Job.total)).all()
    assert [total for _, total in upstream] == [30]
    spent = spend_of(pg_sessions, job_id)["obatch"]
    with pg_sessions() as session:
        prompt, completion = session.execute(
            select(func.sum(Result.prompt_tokens), func.sum(Result.completion_tokens))
            .where(Result.job_id == job_id)).one()
    assert (spent.requests, spent.prompt_tokens, spent.completion_tokens) == (
        30, prompt, completion)
    assert spent.cost == pytest.approx((prompt * BATCH_IN + completion * BATCH_OUT) / 1e6)
    # An upload whose id was never stored is found again at the upstream by its metadata.
    [batch] = cluster.batches(pg_sessions, job_id)
    monkeypatch.setenv("QF_UP_KEY", cluster.env["QF_UP_KEY"])
    client = OpenAIBatches(cluster.settings.load_deployments().deployments["obatch"])
    assert client.find(batch.id, batch.created_at) == batch.provider_id
    assert client.find("qfpb_never_made", batch.created_at) is None
    client.close()
    # The same lines called directly (a job not on the bulk queue skips the batch
    # deployment) give output lines of the same shape, at the realtime price.
    direct = cluster.submit(pg_sessions, [openai_line(i, text="direct") for i in range(3)],
                            queue="standard")
    assert cluster.wait(pg_sessions, direct) == "completed"
    assert deployments_of(pg_sessions, direct) == {"rt-openai": 3}
    shape = output_lines(pg_sessions, direct)[0]
    assert shape.keys() == got[0].keys()
    assert shape["response"].keys() == got[0]["response"].keys()
    assert shape["response"]["body"].keys() == got[0]["response"]["body"].keys()
    realtime = spend_of(pg_sessions, direct)["rt-openai"]
    assert realtime.cost == pytest.approx(
        (realtime.prompt_tokens * REALTIME_IN + realtime.completion_tokens * REALTIME_OUT) / 1e6)


def test_anthropic_batch_with_message_batches_output(cluster: Cluster,
                                                     pg_sessions: sessionmaker[Session]) -> None:
    lines = [anthropic_line(i, "claude-fast") for i in range(12)]
    job_id = cluster.submit(pg_sessions, lines)
    assert cluster.wait(pg_sessions, job_id) == "completed"
    assert deployments_of(pg_sessions, job_id) == {"abatch-fast": 12}
    got = output_lines(pg_sessions, job_id)
    assert [line["custom_id"] for line in got] == [f"a{i}" for i in range(12)]
    for i, line in enumerate(got):
        assert line["result"]["type"] == "succeeded"
        message = line["result"]["message"]
        assert message["type"] == "message" and f"question {i}" in message["content"][0]["text"]
    spent = spend_of(pg_sessions, job_id)["abatch-fast"]
    assert spent.requests == 12
    assert spent.cost == pytest.approx(
        (spent.prompt_tokens * BATCH_IN + spent.completion_tokens * BATCH_OUT) / 1e6)


def test_failed_and_expired_lines_fall_back_to_realtime(
        cluster: Cluster, pg_sessions: sessionmaker[Session]) -> None:
    lines = [anthropic_line(i, "claude-fast", text) for i, text in
             enumerate(["", "[mock:expire]", "", "[mock:error]", ""])]
    job_id = cluster.submit(pg_sessions, lines)
    assert cluster.wait(pg_sessions, job_id) == "completed"
    with pg_sessions() as session:
        by_line = dict(session.execute(select(Result.line_no, Result.deployment)
                                       .where(Result.job_id == job_id)).all())
    assert by_line == {1: "abatch-fast", 2: "rt-anthropic", 3: "abatch-fast",
                       4: "rt-anthropic", 5: "abatch-fast"}
    got = output_lines(pg_sessions, job_id)
    assert [line["result"]["type"] for line in got] == ["succeeded"] * 5
    spent = spend_of(pg_sessions, job_id)
    assert (spent["abatch-fast"].requests, spent["rt-anthropic"].requests) == (3, 2)


def test_cancel_is_passed_on(cluster: Cluster, pg_sessions: sessionmaker[Session]) -> None:
    job_id = cluster.submit(pg_sessions, [anthropic_line(i, "claude-slow") for i in range(8)])
    batch = cluster.wait_submitted(pg_sessions, job_id)
    jobs.cancel_job(pg_sessions, job_id)
    assert cluster.wait(pg_sessions, job_id) == "cancelled"
    remote = {b["id"]: b for b in cluster.anthropic_batches("slow")}[batch.provider_id]
    assert remote["cancel_initiated_at"] is not None
    assert remote["request_counts"]["canceled"] == 8
    with pg_sessions() as session:
        statuses = session.scalars(select(Item.status).where(Item.job_id == job_id)).all()
    assert statuses == ["cancelled"] * 8
    errors = output_lines(pg_sessions, job_id, errors=True)
    assert [line["result"]["type"] for line in errors] == ["canceled"] * 8


def test_polling_resumes_after_a_worker_is_killed(
        cluster: Cluster, pg_sessions: sessionmaker[Session]) -> None:
    job_id = cluster.submit(pg_sessions, [anthropic_line(i, "claude-mid") for i in range(20)])
    batch = cluster.wait_submitted(pg_sessions, job_id)
    cluster.kill_worker(cluster.workers[-1])
    out = {b["id"]: b for b in cluster.anthropic_batches("mid")}[batch.provider_id]
    assert out["processing_status"] == "in_progress"  # killed while the batch was out
    cluster.start_worker()
    assert cluster.wait(pg_sessions, job_id, timeout=50) == "completed"
    assert one_result_per_line(pg_sessions, job_id) == (20, 20)
    mine = [b for b in cluster.anthropic_batches("mid") if b["id"] == batch.provider_id]
    assert len(cluster.anthropic_batches("mid")) == 1 and mine
    assert spend_of(pg_sessions, job_id)["abatch-mid"].requests == 20
    assert [line["custom_id"] for line in output_lines(pg_sessions, job_id)] == [
        f"a{i}" for i in range(20)]



"""Message Batches' domain: the create body as JSONL lines (no server), and on a real
PostgreSQL the objects, cursors and deleting (quotaflow/message_batches.py,
quotaflow/retention.py); the SDK's view of it all is tests/test_message_batches.py's."""

import json
from datetime import timedelta

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from quotaflow import jobs, message_batches, retention
from quotaflow.config import Settings
from quotaflow.dispatch import CollectingDispatcher
from quotaflow.errors import InvalidParameter, JobNotFound, JobStateError
from quotaflow.execution import BatchExecutor
from quotaflow.limiters import LocalLimiter
from quotaflow.message_batch_body import BatchBodyError, open_requests
from quotaflow.models import Item, Job, Result, Spend, utcnow


def body(*requests: object, **extra: object) -> bytes:
    return json.dumps({"requests": list(requests), **extra}).encode()


def req(custom_id: str, text: str = "hi", model: str = "gpt-4o-mini") -> dict:
    return {"custom_id": custom_id, "params": {"model": model, "max_tokens": 16,
                                               "messages": [{"role": "user", "content": text}]}}


# --- the body, read as lines -----------------------------------------------------------

def test_each_request_is_one_line_of_the_bytes_sent() -> None:
    # Pretty-printed JSON, UTF-8 text and escapes: each request's own bytes, one a line
    sent = json.dumps({"requests": [req("a", "h\u00e9 \u2603\n"), req("b")]}, indent=2,
                      ensure_ascii=False).encode()
    lines = open_requests(sent, 10).read().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 3
    assert [json.loads(line) for line in lines[:2]] == [req("a", "h\u00e9 \u2603\n"), req("b")]
    assert "h\u00e9 \u2603".encode() in lines[0]  # not re-encoded as \\u escapes


@pytest.mark.parametrize(("sent", "reason"), [
    (b"", "ends at byte 0"),
    (b"[1]", "must be a JSON object"),
    (b"{}", "requests: Field required"),
    (b'{"requests": {}}', "requests: Input should be a valid list"),
    (b'{"requests": []}', "at least 1 item"),
    (body(req("a"), model="x"), "model: Extra inputs are not permitted"),
    (body(req("a")) + b"x", "extra data at byte"),
    (body(req("a"))[:-3], "not valid JSON"),
    (body(req("a"), req("b"), req("a")), "requests.2.custom_id: duplicate custom_id 'a' "
                                         "(also requests.0.custom_id)"),
    (body(req("a b")), "requests.0.custom_id: String should match pattern"),
    (body(req("x" * 65)), "requests.0.custom_id: String should match pattern"),
    (body({"custom_id": "a"}), "requests.0.params: Field required"),
    (body({"params": {}}), "requests.0.custom_id: Field required"),
    (body({"custom_id": "a", "params": "p"}), "requests.0.params: Input should be a valid"),
    (body({"custom_id": "a", "params": {}, "url": "/v1"}), "requests.0.url: Extra inputs"),
    (body(req("a"), 7), "requests.1: Input should be a valid dictionary"),
    (b'{"requests": ' + b"[" * 50_000, "requests.0: nested too deeply"),
    (body(*[req(f"r{i}") for i in range(4)]), "at most 3 requests"),
])
def test_what_anthropic_refuses_at_creation_names_the_request(sent: bytes, reason: str) -> None:
    with pytest.raises(BatchBodyError) as refused:
        open_requests(sent, 3).read()
    assert reason in str(refused.value)


# --- jobs, objects and cursors on PostgreSQL -------------------------------------------

def create(sessions: sessionmaker[Session], settings: Settings, *requests: dict,
           tenant: str = "t1", dispatcher: CollectingDispatcher | None = None) -> Job:
    return message_batches.create_batch(
        sessions, body(*requests), tenant=tenant, settings=settings,
        deployments=settings.load_deployments(),
        dispatcher=dispatcher or CollectingDispatcher()).job


def test_a_refused_batch_stores_nothing(pg_sessions, settings) -> None:
    bad = {"custom_id": "b", "params": {"messages": []}}
    with pytest.raises(BatchBodyError, match=r"requests\.0: params\.max_tokens"):
        create(pg_sessions, settings, bad, {**bad, "custom_id": "c"})
    with pytest.raises(BatchBodyError, match="duplicate custom_id"):
        create(pg_sessions, settings, *[req(f"r{i}") for i in range(500)], req("r7"))
    with pg_sessions() as session:
        assert session.scalar(select(func.count()).select_from(Job)) == 0
        assert session.scalar(select(func.count()).select_from(Item)) == 0


def test_the_object_follows_the_job(pg_sessions, settings) -> None:
    dispatcher = CollectingDispatcher()
    job = create(pg_sessions, settings, req("a", "one"), req("b", "two"), dispatcher=dispatcher)
    assert job.id.startswith("batch_") and job.output_format == "anthropic"
    message_batch_id = message_batches.batch_id(job.id)
    assert message_batch_id == "msgbatch_" + job.id.removeprefix("batch_")
    assert message_batches.job_id(message_batch_id) == job.id

    def view() -> dict:
        with pg_sessions() as session:
            found = message_batches.get_batch(session, message_batch_id, "t1")
            counts = message_batches.item_counts(session, [found.id])[found.id]
            return message_batches.batch_object(found, counts, "http://qf:8000/")

    started = view()
    assert started["processing_status"] == "in_progress" and started["results_url"] is None
    assert started["request_counts"] == {"processing": 2, "succeeded": 0, "errored": 0,
                                         "canceled": 0, "expired": 0}
    assert started["created_at"].endswith("Z") and started["ended_at"] is None
    executor = BatchExecutor(pg_sessions, settings.load_deployments(), LocalLimiter(), settings)
    for ref in dispatcher.batches:
        executor.run(ref)
    ended = view()
    assert ended["processing_status"] == "ended" and ended["ended_at"].endswith("Z")
    assert ended["request_counts"]["succeeded"] == 2
    assert ended["results_url"] == f"http://qf:8000/v1/messages/batches/{message_batch_id}/results"
    with pg_sessions() as session:
        lines = [json.loads(line) for line in message_batches.result_lines(
            session, message_batches.get_batch(session, message_batch_id, "t1"))]
    assert sorted(line["custom_id"] for line in lines) == ["a", "b"]
    assert {line["result"]["type"] for line in lines} == {"succeeded"}
    # Another tenant, an OpenAI-format job or an id of another shape: not found
    with pg_sessions() as session:
        for tenant, some_id in (("t2", message_batch_id), ("t1", job.id), (None, "msgbatch_x")):
            with pytest.raises(JobNotFound):
                message_batches.get_batch(session, some_id, tenant)


def test_cursors_page_in_both_directions_through_equal_times(pg_sessions, settings) -> None:
    made = [create(pg_sessions, settings, req(f"c{i}")).id for i in range(5)]
    create(pg_sessions, settings, req("other"), tenant="t2")
    # Two created in the same microsecond: the id breaks the tie
    same = utcnow()
    with pg_sessions.begin() as session:
        session.execute(update(Job).where(Job.id.in_(made[1:3])).values(created_at=same))
        session.execute(update(Job).where(Job.id.in_(made[3:])).values(
            created_at=same + timedelta(seconds=1)))
    with pg_sessions() as session:
        every, more = message_batches.list_batches(session, "t1", limit=100)
        assert not more and len(every) == 5
        order = [job.id for job in every]
        assert order[-1] == made[0]
        pages, after = [], None
        while True:
            page, more = message_batches.list_batches(
                session, "t1", limit=2, after_id=after and message_batches.batch_id(after))
            pages.append([job.id for job in page])
            if not more:
                break
            after = page[-1].id
        assert pages == [order[:2], order[2:4], order[4:]]
        back, more = message_batches.list_batches(
            session, "t1", limit=2, before_id=message_batches.batch_id(order[4]))
        assert [job.id for job in back] == order[2:4] and more
        back, more = message_batches.list_batches(
            session, "t1", limit=3, before_id=message_batches.batch_id(order[2]))
        assert [job.id for job in back] == order[:2] and not more
        with pytest.raises(InvalidParameter, match="not both"):
            message_batches.list_batches(session, "t1", limit=2, after_id=order[0],
                                         before_id=order[1])
        with pytest.raises(InvalidParameter, match="after_id"):
            message_batches.list_batches(session, "t2", limit=2,
                                         after_id=message_batches.batch_id(order[0]))


def test_delete_removes_an_ended_job_whole_and_only_it(pg_sessions, settings) -> None:
    dispatcher = CollectingDispatcher()
    doomed = create(pg_sessions, settings, req("a"), req("b"), dispatcher=dispatcher)
    kept = create(pg_sessions, settings, req("a"), req("b"), dispatcher=dispatcher)
    # Running: refused (cancel first); another tenant's: not found
    with pytest.raises(JobStateError, match="cancel it first"):
        retention.delete_job(pg_sessions, doomed.id, "t1")
    executor = BatchExecutor(pg_sessions, settings.load_deployments(), LocalLimiter(), settings)
    for ref in dispatcher.batches:
        executor.run(ref)
    with pg_sessions.begin() as session:
        session.add(Spend(job_id=doomed.id, deployment="d", month="2026-11", tenant="t1",
                          requests=2))
    with pytest.raises(JobNotFound):
        retention.delete_job(pg_sessions, doomed.id, "t2")
    tombstone = retention.delete_job(pg_sessions, doomed.id, "t1")
    assert tombstone.deleted_at is not None  # the job is kept as a tombstone
    with pg_sessions() as session:
        for model in (Item, Result):
            assert session.scalar(select(func.count()).select_from(model)
                                  .where(model.job_id == doomed.id)) == 0
            assert session.scalar(select(func.count()).select_from(model)
                                  .where(model.job_id == kept.id)) > 0
        # the month's spend is history: it stays
        assert session.scalar(select(Spend.requests).where(Spend.job_id == doomed.id)) == 2
        # and it is no Message Batch any more
        with pytest.raises(message_batches.MessageBatchNotFound):
            message_batches.get_batch(session, message_batches.batch_id(doomed.id), "t1")
    # deleting it again gives the tombstone again
    assert retention.delete_job(pg_sessions, doomed.id, "t1").deleted_at == tombstone.deleted_at
    # A job whose lines are still out (an expired job's calls in flight) is refused too
    with pg_sessions.begin() as session:
        session.execute(update(Job).where(Job.id == kept.id).values(status="expired"))
        session.execute(update(Item).where(Item.job_id == kept.id, Item.line_no == 1)
                        .values(status="running",  # under a live lease
                                lease_expires_at=utcnow() + timedelta(seconds=30)))
    with pytest.raises(JobStateError):
        retention.delete_job(pg_sessions, kept.id, "t1")
    with pg_sessions() as session:
        assert jobs.get_job(session, kept.id).status == "expired"

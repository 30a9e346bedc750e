"""Message Batches' domain on a real PostgreSQL: the objects, cursors and deleting
(quotaflow/compat/anthropic_batches.py, quotaflow/compat/retention.py); the create body as
JSONL lines is
tests/unit/compat/test_message_batch_domain.py's, the SDK's view of it all
tests/cluster/test_message_batches.py's."""

import json
from datetime import timedelta

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.budget.buckets import LocalLimiter
from quotaflow.compat import anthropic_batches as message_batches
from quotaflow.compat import retention
from quotaflow.compat.anthropic_batch_body import BatchBodyError
from quotaflow.config import Settings
from quotaflow.dispatch.queues import CollectingDispatcher
from quotaflow.errors import InvalidParameter, JobNotFound, JobStateError
from quotaflow.execution import BatchExecutor
from quotaflow.jobs import service as jobs
from quotaflow.models import Item, Job, Result, Spend, utcnow
from tests.unit.compat.test_message_batch_domain import body, req


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

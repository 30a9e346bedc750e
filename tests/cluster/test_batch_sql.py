"""The two stores' claim and report (quotaflow/store/): PostgreSQL's prepared
statements follow the rules of the portable SQLAlchemy ones SQLite runs, both run here
on PostgreSQL side by side."""

import io
from datetime import timedelta

import pytest
from sqlalchemy import update

from quotaflow.config import Settings
from quotaflow.dispatch.queues import BatchRef
from quotaflow.ingest import pipeline
from quotaflow.models import Item, ItemStatus, Job, JobStatus, utcnow
from quotaflow.providers.base import ProviderResponse
from quotaflow.results import leases
from quotaflow.store.interface import Store
from quotaflow.store.postgres import POSTGRES
from quotaflow.store.sqlite import SQLITE
from tests.cluster.test_jobs import Collect
from tests.harness.factories import chat_line, jsonl

LEASE = timedelta(seconds=60)


def _job(sessions, pg_url: str, lines: int) -> Job:
    settings = Settings(database_url=pg_url, _env_file=None)
    return pipeline.create_job_in_process(
        sessions, io.BytesIO(jsonl([chat_line(f"b{i}") for i in range(lines)])),
        settings=settings, deployments=settings.load_deployments(), dispatcher=Collect(),
        queue="bulk", filename="in.jsonl")


def _state(sessions, job_id: str) -> list[tuple]:
    with sessions() as session:
        return [tuple(row) for row in session.execute(
            Item.__table__.select().with_only_columns(
                Item.line_no, Item.status, Item.attempts, Item.lease_owner)
            .where(Item.job_id == job_id).order_by(Item.line_no))]


def test_the_prepared_claim_takes_what_leases_claim_takes(pg_sessions, pg_url: str) -> None:
    # Given two identical jobs, each with a live lease on line 2 and an expired one on 3
    twins = [_job(pg_sessions, pg_url, 5) for _ in range(2)]
    for job in twins:
        SQLITE.claim(pg_sessions, BatchRef(job.id, 2, 3), "other", LEASE)
        with pg_sessions.begin() as session:
            session.execute(update(Item).where(Item.job_id == job.id, Item.line_no == 3)
                            .values(lease_expires_at=utcnow() - timedelta(seconds=1)))
    # When each is claimed, one by each way
    ours = POSTGRES.claim(pg_sessions, BatchRef(twins[0].id, 1, 4), "me", LEASE)
    theirs = SQLITE.claim(pg_sessions, BatchRef(twins[1].id, 1, 4), "me", LEASE)
    # Then both took the same items (not the live lease's, nor line 5), with their bodies
    assert [item.line_no for item in ours] == [1, 3, 4]
    assert ours == theirs  # the same lines, custom_ids, bodies, attempts, hashes, routes
    assert _state(pg_sessions, twins[0].id) == _state(pg_sessions, twins[1].id)
    # And a job no longer in progress gives nothing
    with pg_sessions.begin() as session:
        session.execute(update(Job).where(Job.id == twins[0].id)
                        .values(status=JobStatus.CANCELLING))
    assert POSTGRES.claim(pg_sessions, BatchRef(twins[0].id, 5, 5), "me", LEASE) == []


@pytest.mark.parametrize("store", [POSTGRES, SQLITE], ids=["postgres", "sqlite"])
def test_the_report_ends_a_job_only_when_nothing_is_open(pg_sessions, pg_url: str,
                                                         store: Store) -> None:
    # Given a job of 3 lines, 2 answered and 1 claimed by another worker
    job = _job(pg_sessions, pg_url, 3)
    mine = leases.claim(pg_sessions, BatchRef(job.id, 1, 2), "me", LEASE)
    leases.claim(pg_sessions, BatchRef(job.id, 3, 3), "other", LEASE)
    answer = ProviderResponse(200, {"choices": []}, "req_1", 1, 1)
    leases.store_many(pg_sessions, job.id, [(item, answer) for item in mine], share=False)
    # When the batch reports: the job goes on, and the other lease is seen
    with pg_sessions.begin() as session:
        latest = store.report(session, BatchRef(job.id, 1, 3))
    with pg_sessions.begin() as session:
        assert session.get(Job, job.id).status == JobStatus.IN_PROGRESS
        expected = session.scalar(Item.__table__.select().with_only_columns(
            Item.lease_expires_at).where(Item.job_id == job.id, Item.line_no == 3))
    assert latest is not None and latest == expected
    # Then once the last line is closed, the report ends it (cancelling: cancelled)
    with pg_sessions.begin() as session:
        session.execute(update(Item).where(Item.job_id == job.id, Item.line_no == 3)
                        .values(status=ItemStatus.FAILED))
        session.execute(update(Job).where(Job.id == job.id).values(
            status=JobStatus.CANCELLING))
    with pg_sessions.begin() as session:
        assert store.report(session, BatchRef(job.id, 1, 3)) is None
    with pg_sessions() as session:
        ended = session.get(Job, job.id)
        assert (ended.status, ended.cancelled_at is not None) == (JobStatus.CANCELLED, True)
    # And close_job alone ends a job whose last line closed (in progress: completed)
    other = _job(pg_sessions, pg_url, 1)
    with pg_sessions.begin() as session:
        session.execute(update(Item).where(Item.job_id == other.id)
                        .values(status=ItemStatus.SUCCEEDED))
        store.close_job(session, other.id)
    with pg_sessions() as session:
        done = session.get(Job, other.id)
        assert done.status == JobStatus.COMPLETED and done.completed_at is not None

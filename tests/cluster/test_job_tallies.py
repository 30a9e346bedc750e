"""A job's counts and usage, kept by the statements that change them (migration 0022).

Every cluster test ends by comparing the kept tallies with a full recount (conftest.py's
tallies_exact_after_each_test), so each path the suite takes is checked; these tests
walk the statement kinds one by one, store one job's chunks from many connections at
once, and show that the job object reads the kept tallies rather than counting.
"""

import asyncio
import io
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from sqlalchemy import delete, text, update
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.config import Settings
from quotaflow.dispatch.queues import BatchRef
from quotaflow.ingest import pipeline
from quotaflow.jobs import service as jobs
from quotaflow.jobs import tallies
from quotaflow.jobs import view as job_view
from quotaflow.models import Item, ItemStatus, Job, Result
from quotaflow.providers.mock import MockProvider
from quotaflow.results.leases import claim, store_many
from tests.harness.factories import chat_line, jsonl
from tests.harness.tallies import mismatches


class Collect:
    def __init__(self) -> None:
        self.batches: list[BatchRef] = []

    def dispatch(self, queue: str, batches: list[BatchRef]) -> None:
        self.batches.extend(batches)


def create(sessions: sessionmaker[Session], settings: Settings, lines: int,
           dispatcher: Collect) -> Job:
    data = jsonl([chat_line(f"r{i}") for i in range(lines)] + ["not json"])
    return pipeline.create_job_in_process(
        sessions, io.BytesIO(data), settings=settings, deployments=settings.load_deployments(),
        dispatcher=dispatcher, queue="bulk", filename="in.jsonl")


def exact(sessions: sessionmaker[Session]) -> None:
    with sessions() as session:
        assert mismatches(session.connection()) == []


def kept(sessions: sessionmaker[Session], job_id: str) -> dict[str, int]:
    with sessions() as session:
        return tallies.tallies(session, [job_id])[job_id]


def answer(items: list) -> list:
    return [(item, asyncio.run(MockProvider().send("/v1/chat/completions", item.body)))
            for item in items]


def test_each_kind_of_statement_keeps_the_tallies_exact(pg_sessions, settings) -> None:
    dispatcher = Collect()
    settings.batch_size = 10
    job = create(pg_sessions, settings, 30, dispatcher)  # COPY: 30 pending, 1 failed line
    assert kept(pg_sessions, job.id) == {"pending": 30, "failed": 1}
    exact(pg_sessions)

    claimed = claim(pg_sessions, dispatcher.batches[0], "w1", timedelta(seconds=60))
    assert kept(pg_sessions, job.id) == {"pending": 20, "running": 10, "failed": 1}
    with pg_sessions.begin() as session:  # a lease renewal changes no status
        session.execute(update(Item).where(Item.job_id == job.id, Item.status == "running")
                        .values(lease_owner="w1"))
    assert kept(pg_sessions, job.id)["running"] == 10

    assert store_many(pg_sessions, job.id, answer(claimed)) == (10, 0)
    stored = kept(pg_sessions, job.id)
    assert stored["succeeded"] == 10 and "running" not in stored
    assert stored["prompt_tokens"] > 0 and stored["completion_tokens"] > 0
    assert store_many(pg_sessions, job.id, answer(claimed)) == (0, 0)  # stored again: ignored
    assert kept(pg_sessions, job.id) == stored
    exact(pg_sessions)

    jobs.cancel_job(pg_sessions, job.id)  # the 20 pending lines end cancelled
    assert kept(pg_sessions, job.id)["cancelled"] == 20
    exact(pg_sessions)

    with pg_sessions.begin() as session:  # deletions take their counts and usage away
        session.execute(delete(Result).where(Result.job_id == job.id, Result.line_no <= 5))
        session.execute(delete(Item).where(Item.job_id == job.id, Item.line_no <= 5))
    assert kept(pg_sessions, job.id)["succeeded"] == 5
    exact(pg_sessions)


def test_chunks_of_one_job_stored_from_many_connections_at_once(pg_sessions, settings) -> None:
    # Rows are kept per writing backend: eight writers never wait on each other's tally
    # rows, never deadlock, and the sums stay exact.
    dispatcher = Collect()
    settings.batch_size = 25
    job = create(pg_sessions, settings, 400, dispatcher)

    def run(ref: BatchRef) -> tuple[int, int]:
        items = claim(pg_sessions, ref, f"w{ref.first_line}", timedelta(seconds=60))
        return store_many(pg_sessions, job.id, answer(items))

    with ThreadPoolExecutor(8) as pool:
        stored = list(pool.map(run, dispatcher.batches))
    assert sum(inserted for inserted, _ in stored) == 400
    assert kept(pg_sessions, job.id)["succeeded"] == 400
    exact(pg_sessions)


def test_the_job_object_reads_the_kept_tallies_not_a_recount(pg_sessions, settings) -> None:
    dispatcher = Collect()
    job = create(pg_sessions, settings, 3, dispatcher)
    with pg_sessions.begin() as session:  # a tally row no item stands behind
        session.execute(text("INSERT INTO job_tallies VALUES (:job, -1, 'expired', 7)"),
                        {"job": job.id})
    with pg_sessions() as session:
        counts = job_view.job_object(session, jobs.get_job(session, job.id))["request_counts"]
        recounted = tallies.recount(session, [job.id])[job.id]
    assert counts["expired"] == 7 and ItemStatus.EXPIRED not in recounted
    with pg_sessions.begin() as session:  # the autouse check would (rightly) refuse it
        session.execute(text("DELETE FROM job_tallies WHERE shard = -1"))

"""A large job's batches grow (quotaflow/dispatch/batch_sizes.py), and a batch that runs
past half of Celery's soft time limit hands its unsent lines back to the queue."""

import asyncio
import io
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.budget.buckets import LocalLimiter
from quotaflow.config import Settings
from quotaflow.dispatch.batch_sizes import GROW_EVERY
from quotaflow.dispatch.queues import BatchRef, CollectingDispatcher
from quotaflow.execution import BatchExecutor
from quotaflow.execution.loops import ProviderPool
from quotaflow.ingest import pipeline
from quotaflow.models import Item, ItemStatus, Job, JobStatus, Result
from quotaflow.providers import ProviderResponse
from quotaflow.providers.mock import MockProvider
from tests.harness.factories import chat_line, jsonl


def create(sessions: sessionmaker[Session], settings: Settings,
           lines: list[dict]) -> tuple[Job, list[BatchRef]]:
    dispatcher = CollectingDispatcher()
    job = pipeline.create_job_in_process(
        sessions, io.BytesIO(jsonl(lines)), settings=settings,
        deployments=settings.load_deployments(), dispatcher=dispatcher, queue="bulk")
    return job, dispatcher.batches


def sizes(batches: list[BatchRef]) -> list[int]:
    return [b.last_line - b.first_line + 1 for b in batches]


def test_a_large_jobs_later_batches_grow_to_the_largest(pg_sessions, settings) -> None:
    settings.batch_size, settings.largest_batch_size = 2, 8
    lines = 2 * GROW_EVERY + 4 * GROW_EVERY + 8 * 3 + 5
    _, batches = create(pg_sessions, settings, [chat_line(f"r{i}") for i in range(lines)])
    ordered = sorted(batches, key=lambda b: b.first_line)
    assert sizes(ordered) == [2] * GROW_EVERY + [4] * GROW_EVERY + [8] * 3 + [5]
    assert [b.first_line for b in ordered[1:]] == [b.last_line + 1 for b in ordered[:-1]]
    assert (ordered[0].first_line, ordered[-1].last_line) == (1, lines)


def test_growth_also_cuts_the_batches_left_after_shared_lines(pg_sessions, settings) -> None:
    # Identical greedy lines share one answer: the pending ones are cut again, growing
    settings.batch_size, settings.largest_batch_size = 2, 4
    distinct = 2 * GROW_EVERY + 4 * 2
    lines = [chat_line(f"r{i}", temperature=0) for i in range(distinct)]
    lines += [chat_line(f"copy{i}", prompt="prompt of r0", temperature=0) for i in range(3)]
    job, batches = create(pg_sessions, settings, lines)
    with pg_sessions() as session:
        pending = session.scalar(select(func.count()).where(
            Item.job_id == job.id, Item.status == ItemStatus.PENDING))
    assert pending == distinct
    assert sizes(batches) == [2] * GROW_EVERY + [4, 4]


class SlowProvider(MockProvider):
    """The mock's answers, 0.2 s after each call."""

    async def send(self, url: str, body: dict[str, Any]) -> ProviderResponse:
        await asyncio.sleep(0.2)
        return await super().send(url, body)


def test_a_batch_past_half_its_time_limit_hands_its_unsent_lines_back(pg_sessions,
                                                                       settings) -> None:
    # Given a batch of 60 lines on a deployment answering 16 calls every 0.2 s (0.8 s in
    # all) under a soft time limit of 1 s (the least: the hard limit, 1 s, less 30)
    settings.task_time_limit_s = 1
    job, [ref] = create(pg_sessions, settings, [chat_line(f"r{i}") for i in range(60)])
    executor = BatchExecutor(pg_sessions, settings.load_deployments(), LocalLimiter(), settings,
                             providers=ProviderPool(lambda _deployment: SlowProvider()))
    # When it runs, past 0.5 s its unsent lines go back to the queue, to run again at once
    report = executor.run(ref)
    assert report.claimed == 60 and 0 < report.succeeded < 60 and report.failed == 0
    assert report.retry_in == 0.0
    with pg_sessions() as session:
        pending = session.scalar(select(func.count()).where(
            Item.job_id == job.id, Item.status == ItemStatus.PENDING))
    assert pending == 60 - report.succeeded
    # And the message run again finishes them: every line answered once
    again = executor.run(ref)
    assert again.claimed == pending and again.succeeded + report.succeeded == 60
    with pg_sessions() as session:
        results = session.scalars(select(Result.line_no).where(Result.job_id == job.id)).all()
        status = session.get_one(Job, job.id).status
    assert sorted(results) == list(range(1, 61)) and status == JobStatus.COMPLETED


def test_the_hand_back_comes_before_celerys_soft_limit_whatever_the_limit(pg_sessions,
                                                                          settings) -> None:
    # Celery's soft limit is 30 s before the hard one; half of the hard one would be later
    # than the soft one below a 60 s limit
    for limit, hand_back in ((900, 435.0), (40, 5.0)):
        settings.task_time_limit_s = limit
        executor = BatchExecutor(pg_sessions, settings.load_deployments(), LocalLimiter(),
                                 settings)
        assert executor.admitter.hand_back_after_s == hand_back
        embedded = BatchExecutor(pg_sessions, settings.load_deployments(), LocalLimiter(),
                                 settings, defer=False)
        assert embedded.admitter.hand_back_after_s == float("inf")

"""Run one batch of a job: claim -> call -> store -> finish.

Each step is its own function so the Celery task and the embedded runner read
the same way. Claims are conditional UPDATE ... RETURNING with a lease, so two
workers never run one item at once; results are insert-or-ignore, so a batch
that runs again after a crash adds no second result.
"""

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import and_, exists, func, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.config import Deployments
from quotaflow.db import insert_ignore
from quotaflow.errors import ConfigError, PermanentProviderError, ProviderError
from quotaflow.jobs import BatchRef, finish_if_done, new_request_id
from quotaflow.models import Item, ItemStatus, Job, JobStatus, Result, utcnow
from quotaflow.providers import Provider, ProviderResponse, make_provider
from quotaflow.retries import RetryPolicy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClaimedItem:
    line_no: int
    custom_id: str | None
    body: dict[str, Any]
    attempts: int


@dataclass(frozen=True)
class Failure:
    """Why an item failed, as its error line will say."""

    code: str
    message: str
    status_code: int | None = None
    body: dict[str, Any] | None = None


Outcome = ProviderResponse | Failure


@dataclass(frozen=True)
class BatchReport:
    """What one run of a batch did; retry_in is set when items are leased elsewhere."""

    claimed: int
    succeeded: int
    failed: int
    retry_in: float | None = None


def claim(sessions: sessionmaker[Session], ref: BatchRef, owner: str,
          lease: timedelta) -> list[ClaimedItem]:
    """Take the batch's pending items (and items whose lease ran out) for this worker."""
    now = utcnow()
    job_running = exists().where(Job.id == ref.job_id, Job.status == JobStatus.IN_PROGRESS)
    statement = (
        update(Item)
        .where(Item.job_id == ref.job_id,
               Item.line_no.between(ref.first_line, ref.last_line),
               or_(Item.status == ItemStatus.PENDING,
                   and_(Item.status == ItemStatus.RUNNING, Item.lease_expires_at < now)),
               job_running)
        .values(status=ItemStatus.RUNNING, attempts=Item.attempts + 1,
                lease_owner=owner, lease_expires_at=now + lease)
        .returning(Item.line_no, Item.custom_id, Item.body, Item.attempts)
    )
    with sessions.begin() as session:
        rows = session.execute(statement).all()
    return sorted((ClaimedItem(*row) for row in rows), key=lambda item: item.line_no)


def leased_elsewhere_for(sessions: sessionmaker[Session], ref: BatchRef) -> float | None:
    """Seconds until the last foreign lease in the range runs out, or None if none is held."""
    with sessions() as session:
        latest = session.scalar(
            select(func.max(Item.lease_expires_at))
            .where(Item.job_id == ref.job_id,
                   Item.line_no.between(ref.first_line, ref.last_line),
                   Item.status == ItemStatus.RUNNING))
    if latest is None:
        return None
    if latest.tzinfo is None:  # SQLite hands datetimes back without their zone
        latest = latest.replace(tzinfo=utcnow().tzinfo)
    return max(1.0, (latest - utcnow()).total_seconds() + 1.0)


async def call_with_retries(provider: Provider, url: str, body: dict[str, Any],
                            policy: RetryPolicy) -> Outcome:
    """One item's provider call: retry what is retryable, fail at once what is not."""
    last: ProviderError | None = None
    for attempt in range(1, policy.max_attempts + 1):
        try:
            return await provider.send(url, body)
        except PermanentProviderError as exc:
            return Failure("provider_error", f"{exc} (attempt {attempt}, not retried)",
                           exc.status_code, exc.body)
        except ProviderError as exc:
            last = exc
            if attempt < policy.max_attempts:
                await asyncio.sleep(policy.delay(attempt, exc.retry_after))
    assert last is not None
    return Failure("provider_error", f"{last} (gave up after {policy.max_attempts} attempts)",
                   last.status_code, last.body)


def store(sessions: sessionmaker[Session], job_id: str, item: ClaimedItem,
          outcome: Outcome) -> bool:
    """Write the item's one result and close the item; True when it succeeded.

    The result row is insert-or-ignore: if another worker stored first, its
    result stands and the item's status follows the stored row.
    """
    if isinstance(outcome, Failure):
        values = dict(status_code=outcome.status_code, response=outcome.body,
                      error={"code": outcome.code, "line": item.line_no,
                             "message": outcome.message},
                      prompt_tokens=0, completion_tokens=0)
    else:
        values = dict(status_code=outcome.status_code, response=outcome.body, error=None,
                      prompt_tokens=outcome.prompt_tokens,
                      completion_tokens=outcome.completion_tokens)
    with sessions.begin() as session:
        session.execute(insert_ignore(session, Result.__table__).values(
            job_id=job_id, line_no=item.line_no, custom_id=item.custom_id,
            request_id=new_request_id(), created_at=utcnow(), **values))
        stored_error = session.scalar(select(Result.error).where(
            Result.job_id == job_id, Result.line_no == item.line_no))
        succeeded = stored_error is None
        session.execute(
            update(Item)
            .where(Item.job_id == job_id, Item.line_no == item.line_no,
                   Item.status.in_(ItemStatus.OPEN))
            .values(status=ItemStatus.SUCCEEDED if succeeded else ItemStatus.FAILED,
                    lease_owner=None, lease_expires_at=None))
    return succeeded


class BatchExecutor:
    """Runs batches against the configured deployments; one per worker process."""

    def __init__(self, sessions: sessionmaker[Session], deployments: Deployments,
                 lease: timedelta, policy: RetryPolicy) -> None:
        self.sessions = sessions
        self.deployments = deployments
        self.lease = lease
        self.policy = policy

    def run(self, ref: BatchRef,
            on_item: Callable[[bool], None] | None = None) -> BatchReport:
        return asyncio.run(self.run_async(ref, on_item))

    async def run_async(self, ref: BatchRef,
                        on_item: Callable[[bool], None] | None = None) -> BatchReport:
        owner = uuid.uuid4().hex
        items = claim(self.sessions, ref, owner, self.lease)
        with self.sessions() as session:
            url = session.scalar(select(Job.endpoint).where(Job.id == ref.job_id)) or ""
        providers: dict[str, Provider] = {}
        limits: dict[str, asyncio.Semaphore] = {}
        counts = {True: 0, False: 0}

        async def process(item: ClaimedItem) -> None:
            outcome = await self._call(item, url, providers, limits)
            ok = store(self.sessions, ref.job_id, item, outcome)
            counts[ok] += 1
            if on_item is not None:
                on_item(ok)

        try:
            await asyncio.gather(*(process(item) for item in items))
        finally:
            for provider in providers.values():
                await provider.aclose()
        finish_if_done(self.sessions, ref.job_id)
        return BatchReport(len(items), counts[True], counts[False],
                           leased_elsewhere_for(self.sessions, ref))

    async def _call(self, item: ClaimedItem, url: str, providers: dict[str, Provider],
                    limits: dict[str, asyncio.Semaphore]) -> Outcome:
        deployment = self.deployments.for_model(item.body.get("model"))
        if deployment is None:
            return Failure("no_deployment",
                           f"no deployment serves model {item.body.get('model')!r}")
        try:
            provider = providers.get(deployment.name) or providers.setdefault(
                deployment.name, make_provider(deployment))
        except ConfigError as exc:
            return Failure("configuration_error", str(exc))
        semaphore = limits.setdefault(deployment.name,
                                      asyncio.Semaphore(deployment.max_concurrency))
        async with semaphore:
            body = {**item.body, "model": deployment.model}
            return await call_with_retries(provider, url, body, self.policy)


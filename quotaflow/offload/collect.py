"""An ended provider batch's lines, each closed the way a direct call would close it.

Answers and permanent failures are stored by leases.store_many with the batch
deployment's provenance and billing (its prices are the batch prices), a chunk at a
time: insert-or-ignore, so results downloaded twice after a crash are stored and billed
once. Lines the provider did not answer (cancelled, expired, or failed in a way another
deployment may not) end as their job's end says (cancelled, expired), else go back to
the queue for the route's realtime deployments where it has any, else are stored as
failures or end expired/cancelled.
"""

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.deployments.catalog import Deployments
from quotaflow.dispatch.queues import Dispatcher, batch_refs
from quotaflow.jobs.service import finish_if_done
from quotaflow.models import ITEMS_ENDED_BY, ItemStatus, JobStatus, utcnow
from quotaflow.offload import OWNER
from quotaflow.offload.batch_tables import LineState, ProviderBatch, ProviderBatchLine
from quotaflow.offload.results import LineResult
from quotaflow.providers.anthropic_answers import reshape
from quotaflow.providers.base import ProviderResponse
from quotaflow.providers.outcomes import Failure, Outcome, Provenance
from quotaflow.results.leases import ITEMS, ClaimedItem, store_many
from quotaflow.tenants import spend
from quotaflow.tenants.spend import Billing

log = logging.getLogger(__name__)
LINES = ProviderBatchLine.__table__
STORE_CHUNK = 500


@dataclass(frozen=True)
class OffloadedJob:
    """What a provider batch's loop needs of the job its lines belong to."""

    id: str
    status: str
    queue: str
    url: str
    tenant: str
    output_format: str
    expires_at: datetime | None
    stop_reason: str | None = None

    @property
    def ended(self) -> str | None:
        """The status its unanswered lines end with, once the job no longer wants them:
        cancelled, expired, or spend_limited (its tenant reached its monthly limit)."""
        if self.status == JobStatus.IN_PROGRESS and self.stop_reason == spend.STOP_REASON:
            return ItemStatus.SPEND_LIMITED
        return ITEMS_ENDED_BY.get(self.status)


@dataclass
class Collector:
    """Closes the lines of provider batches of one worker's loop."""

    sessions: sessionmaker[Session]
    deployments: Deployments
    dispatcher: Dispatcher
    batch_size: int
    patience: timedelta

    def held(self, batch: ProviderBatch) -> dict[int, ClaimedItem]:
        """The batch's lines whose items still wait for it, as claimed items."""
        with self.sessions() as session:
            rows = session.execute(
                select(ITEMS.c.line_no, ITEMS.c.custom_id, ITEMS.c.body, ITEMS.c.attempts,
                       ITEMS.c.body_hash, ITEMS.c.route)
                .join(LINES, (LINES.c.job_id == ITEMS.c.job_id)
                      & (LINES.c.line_no == ITEMS.c.line_no))
                .where(LINES.c.provider_batch_id == batch.id,
                       LINES.c.state == LineState.ASSIGNED,
                       ITEMS.c.status == ItemStatus.RUNNING, ITEMS.c.lease_owner == OWNER)
                .order_by(ITEMS.c.line_no)).all()
        return {row[0]: ClaimedItem(*row) for row in rows}

    def collect(self, batch: ProviderBatch, job: OffloadedJob, results: Iterable[LineResult],
                unrun: str) -> None:
        """Store what the provider answered; the lines it did not, see `settle`. `unrun`:
        the kind of a line missing from the results (its batch was cancelled, expired or
        failed)."""
        items = self.held(batch)
        answered_at = (batch.ended_at or utcnow()).timestamp()
        sent_at = (batch.submitted_at or batch.created_at).timestamp()
        record = Provenance(batch.deployment, 1, sent_at, sent_at, answered_at)
        billing = Billing.for_job(job.tenant, self.deployments)
        chunk: list[tuple[ClaimedItem, Outcome]] = []
        others: list[LineResult] = []
        seen: set[int] = set()
        for result in results:
            item = items.get(result.line_no)
            if item is None or result.line_no in seen:
                continue
            seen.add(result.line_no)
            if result.outcome is not None and not (result.retryable and self._can_fall_back(
                    item, job)):
                chunk.append((item, _shaped(result.outcome, job.output_format)))
                if len(chunk) >= STORE_CHUNK:
                    self._store(batch, job, chunk, record, billing)
                    chunk = []
            else:
                others.append(result)
        self._store(batch, job, chunk, record, billing)
        for line_no in items.keys() - seen:
            others.append(LineResult(line_no, unrun, None, True))
        self.settle(job, items, others)

    def settle(self, job: OffloadedJob, items: dict[int, ClaimedItem],
               unanswered: list[LineResult]) -> None:
        """Lines that got no answer to keep: ended with their job, sent to realtime, or
        closed as the provider left them."""
        ended = job.ended
        back, failed = [], []
        stopped: dict[str, list[int]] = {ItemStatus.CANCELLED: [], ItemStatus.EXPIRED: [],
                                         ItemStatus.SPEND_LIMITED: []}
        for result in unanswered:
            item = items[result.line_no]
            if ended is not None:
                stopped[ended].append(result.line_no)
            elif self._can_fall_back(item, job):
                back.append(result.line_no)
            elif result.outcome is not None:
                failed.append((item, _shaped(result.outcome, job.output_format)))
            else:
                stopped[ItemStatus.CANCELLED if result.kind == "cancelled"
                        else ItemStatus.EXPIRED].append(result.line_no)
        if failed:
            store_many(self.sessions, job.id, failed)
            self._lines_done(job.id, [item.line_no for item, _ in failed])
        for status, lines in stopped.items():
            self.end(job.id, lines, status)
        self.to_realtime(job, back)
        finish_if_done(self.sessions, job.id)

    def to_realtime(self, job: OffloadedJob, lines: list[int]) -> None:
        """Hand lines back to the queue; the executor sends them to realtime deployments
        (their LineState.REALTIME keeps them out of provider batches)."""
        if not lines:
            return
        with self.sessions.begin() as session:
            session.execute(update(LINES).where(LINES.c.job_id == job.id,
                                                LINES.c.line_no.in_(lines))
                            .values(state=LineState.REALTIME))
            moved = sorted(session.scalars(
                update(ITEMS)
                .where(ITEMS.c.job_id == job.id, ITEMS.c.line_no.in_(lines),
                       ITEMS.c.status == ItemStatus.RUNNING, ITEMS.c.lease_owner == OWNER)
                .values(status=ItemStatus.PENDING, lease_owner=None,
                        lease_expires_at=utcnow() + self.patience)
                .returning(ITEMS.c.line_no)).all())
        log.info("provider batch lines of job %s: %d sent to realtime deployments", job.id,
                 len(moved), extra={"job_id": job.id})
        self.dispatcher.dispatch(job.queue, batch_refs(job.id, moved, self.batch_size))

    def end(self, job_id: str, lines: list[int], status: str) -> None:
        """Close lines the provider never ran, as a direct call never sent would be."""
        if not lines:
            return
        with self.sessions.begin() as session:
            session.execute(update(ITEMS)
                            .where(ITEMS.c.job_id == job_id, ITEMS.c.line_no.in_(lines),
                                   ITEMS.c.status == ItemStatus.RUNNING,
                                   ITEMS.c.lease_owner == OWNER)
                            .values(status=status, lease_owner=None, lease_expires_at=None))
        self._lines_done(job_id, lines)

    def _can_fall_back(self, item: ClaimedItem, job: OffloadedJob) -> bool:
        if job.ended is not None:
            return False
        route = self.deployments.route_named(item.route)
        return route is not None and route.realtime(self.deployments) is not None

    def _store(self, batch: ProviderBatch, job: OffloadedJob,
               chunk: list[tuple[ClaimedItem, Outcome]], record: Provenance,
               billing: Billing) -> None:
        if not chunk:
            return
        store_many(self.sessions, job.id, chunk, True, [record] * len(chunk), billing.stored)
        self._lines_done(job.id, [item.line_no for item, _ in chunk])

    def _lines_done(self, job_id: str, lines: list[int]) -> None:
        with self.sessions.begin() as session:
            session.execute(update(LINES).where(LINES.c.job_id == job_id,
                                                LINES.c.line_no.in_(lines))
                            .values(state=LineState.DONE))


def _shaped(outcome: ProviderResponse | Failure, output_format: str) -> Outcome:
    if isinstance(outcome, ProviderResponse) and outcome.answer_format != output_format:
        return reshape(outcome, output_format)
    return outcome

"""Run one batch of a job: claim -> route -> acquire budget -> call -> settle -> store.

The Celery task and the embedded runner both come through BatchExecutor. The
loop itself is admission.py (which deployment, how much budget) and
attempts.py (calls and retries); the policies it consults plug in beside it:
the retry policy (quotaflow/retries.py), provider feedback (feedback.py),
lease renewal (leasing.py) and result writing (writer.py), the last two a
chunk at a time rather than per request. Outcomes and their failure codes
are quotaflow/outcomes.py.
"""

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import exists, func, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.capabilities import serves, serving_route, unserved_message
from quotaflow.circuit import CircuitBreaker, LocalCircuitBreaker
from quotaflow.config import Settings
from quotaflow.constants import QUEUE_BULK, QUEUE_REALTIME
from quotaflow.deployments import Deployments, Route
from quotaflow.dispatch import BatchRef
from quotaflow.errors import ServiceUnavailable
from quotaflow.execution import loops
from quotaflow.execution.admission import YIELD_S, Admitter
from quotaflow.execution.attempts import Caller
from quotaflow.execution.batch import BatchReport, BatchRun
from quotaflow.execution.fairness import TenantShare
from quotaflow.execution.feedback import Feedback
from quotaflow.execution.leasing import keep_leases
from quotaflow.execution.loops import PROVIDERS, ProviderPool
from quotaflow.execution.prepare import Preparer
from quotaflow.execution.stopping import JobWatch
from quotaflow.execution.writer import ResultWriter
from quotaflow.fairshare import FairShare, NoFairShare
from quotaflow.jobs import close_if_done
from quotaflow.leases import ClaimedItem, claim, leased_elsewhere_for
from quotaflow.metrics import Tally
from quotaflow.models import Item, Job, Tenant
from quotaflow.outcomes import Failure, FailureCode
from quotaflow.pbatch import enqueue as pbatch_enqueue
from quotaflow.ratelimit import Limiter
from quotaflow.retries import RetryPolicy
from quotaflow.reuse import earlier_answers
from quotaflow.routing import Router
from quotaflow.spend import Billing

log = logging.getLogger(__name__)

# Jobs whose facts a worker process keeps (the oldest read is forgotten first).
JOB_FACTS_KEPT = 1024
# How often a running batch looks whether feedback or results are due to be written.
FLUSH_TICK_S = 0.01
# After a failed write, the next try waits this long (the database may be restarting),
# doubling up to MAX_WRITE_RETRY_S; a batch keeps its answers for KEEP_ANSWERS_S at most.
WRITE_RETRY_S = 1.0
MAX_WRITE_RETRY_S = 5.0
KEEP_ANSWERS_S = 300.0


@dataclass(frozen=True)
class _JobFacts:
    url: str
    queue: str
    max_attempts: int | None
    tenant: str
    has_duplicates: bool  # some items wait for an identical line's answer
    output_format: str  # "openai" or "anthropic": the shape its answers are stored in
    weight: float  # its tenant's weight in fair shares of a budget (quotaflow/fairshare.py)


class BatchExecutor:
    """Runs batches against the configured deployments; one per worker process.

    `breaker` must be shared by every worker (the Redis one) in a cluster; the
    in-process one serves the embedded runner. `defer` says whether a long wait
    for budget may hand items back to the queue (Celery) or must be slept
    through (the embedded runner).
    """

    def __init__(self, sessions: sessionmaker[Session], deployments: Deployments,
                 limiter: Limiter, settings: Settings, breaker: CircuitBreaker | None = None,
                 defer: bool = True, providers: ProviderPool = PROVIDERS,
                 provider_batches: bool | None = None, fair: FairShare | None = None) -> None:
        self.sessions = sessions
        self.deployments = deployments
        self.limiter = limiter
        self.breaker = breaker or LocalCircuitBreaker()
        self.settings = settings
        self.lease = timedelta(seconds=settings.lease_seconds)
        self.providers = providers
        self.fair = fair or NoFairShare()
        self._jobs: dict[str, _JobFacts] = {}
        self._prices = {name: d.prices for name, d in deployments.deployments.items()}
        # Calls cost something only where a deployment has prices: else nothing is billed
        # and no spend limit is looked at (quotaflow/spend.py).
        self._spending = any(prices is not None for prices in self._prices.values())
        # Whether bulk lines may go to provider batch deployments: only where workers run
        # the poll loop (Celery); the embedded runner treats them as unavailable.
        self.provider_batches = defer if provider_batches is None else provider_batches
        router = Router(deployments, limiter, self.breaker)
        preparer = Preparer(deployments, self.providers)
        self.admitter = Admitter(
            sessions, deployments, router, limiter, preparer, Caller(router, limiter, preparer),
            settings, settings.max_inline_wait_s if defer else float("inf"))

    def run(self, ref: BatchRef, on_item: Callable[[bool], None] | None = None) -> BatchReport:
        """Run the batch on this thread's long-lived loop (its connections stay open)."""
        return loops.run(self.run_async(ref, on_item))

    async def aclose(self) -> None:
        """Close the running loop's provider connections."""
        await self.providers.aclose()

    async def run_async(self, ref: BatchRef,
                        on_item: Callable[[bool], None] | None = None) -> BatchReport:
        owner = uuid.uuid4().hex
        job = self._facts(ref.job_id)
        fair = job.queue != QUEUE_REALTIME
        if fair and self._give_way(job.tenant):
            # Another tenant's batches wait behind this one in the queue: let a worker
            # reach them (quotaflow/fairshare.py); this one claims nothing and comes back.
            return BatchReport(0, 0, 0, YIELD_S)
        items = claim(self.sessions, ref, owner, self.lease)
        if not items:
            return self._report(ref, BatchReport(0, 0, 0))
        if fair:
            _best_effort(self.fair.start, job.tenant)
        try:
            return await self._run_claimed(ref, owner, job, items, fair, on_item)
        finally:
            if fair:
                _best_effort(self.fair.stop, job.tenant)

    def _give_way(self, tenant: str) -> bool:
        try:
            if self.fair.others_waiting(tenant) == 0:
                return False
            self.fair.queued(tenant)
        except ServiceUnavailable:
            return False
        return True

    async def _run_claimed(self, ref: BatchRef, owner: str, job: "_JobFacts",
                           items: list[ClaimedItem], fair: bool,
                           on_item: Callable[[bool], None] | None) -> BatchReport:
        policy = RetryPolicy(max_attempts=job.max_attempts
                             or self.settings.provider_max_attempts,
                             max_wait_s=self.settings.max_retry_after_s)
        run = BatchRun(ref, owner, job.url, self.settings.floor_for(job.queue), policy,
                       ResultWriter(self.sessions, ref.job_id, on_item, job.has_duplicates,
                                    billing=(Billing(job.tenant, self._prices)
                                             if self._spending else None)),
                       Feedback(self.limiter, self.breaker, Tally(job.queue)),
                       JobWatch(self.sessions, ref.job_id, job.tenant,
                                self.settings.max_monthly_spend, self._spending),
                       output_format=job.output_format,
                       share=TenantShare(self.fair if fair else NoFairShare(), job.tenant,
                                         job.weight))
        reused = (earlier_answers(self.sessions, ref.job_id, job.tenant, items,
                                  job.output_format)
                  if self.settings.dedup_across_jobs else {})
        by_route: dict[str | None, list[ClaimedItem]] = {}
        for item in items:
            if item.line_no in reused:
                run.finish(item, reused[item.line_no])
            else:
                by_route.setdefault(self._route_name(item), []).append(item)
        keeper = asyncio.create_task(keep_leases(self.sessions, ref.job_id, owner, self.lease))
        flusher = asyncio.create_task(self._flush_when_due(run))
        try:
            await asyncio.gather(*(self._run_route(run, job, name, group)
                                   for name, group in by_route.items()))
        finally:
            keeper.cancel()
            flusher.cancel()  # a write under way goes on (shielded); the next one waits
            with contextlib.suppress(asyncio.CancelledError):
                await flusher
            run.feedback.flush()
            run.share.close()
            await _store_all(run)  # answers are kept, whatever ended the batch
        report = BatchReport(len(items), run.writer.succeeded, run.writer.failed, run.retry_in)
        if fair and report.retry_in is not None:
            _best_effort(self.fair.queued, job.tenant)  # its unstarted items wait again
        log.info("batch %s lines %d-%d: %d claimed, %d succeeded, %d failed", ref.job_id,
                 ref.first_line, ref.last_line, report.claimed, report.succeeded,
                 report.failed, extra={**run.context, "claimed": report.claimed,
                                       "succeeded": report.succeeded, "failed": report.failed,
                                       "retry_in": report.retry_in})
        return self._report(ref, report)

    def _facts(self, job_id: str) -> "_JobFacts":
        """What a job's batches all need to know of it, read once per process: none of
        it changes after the job is created."""
        facts = self._jobs.get(job_id)
        if facts is None:
            twins = exists().where(Item.job_id == job_id, Item.duplicate_of.is_not(None))
            with self.sessions() as session:
                row = session.execute(
                    select(Job.endpoint, Job.queue, Job.max_attempts, Job.tenant,
                           twins.label("twins"), Job.output_format,
                           func.coalesce(Tenant.weight, 1.0))
                    .outerjoin(Tenant, Tenant.name == Job.tenant)
                    .where(Job.id == job_id)).one()
            if len(self._jobs) >= JOB_FACTS_KEPT:
                self._jobs.pop(next(iter(self._jobs)))
            facts = self._jobs[job_id] = _JobFacts(*row)
        return facts

    def _report(self, ref: BatchRef, report: BatchReport) -> BatchReport:
        """Close the job if this was its last work; look again later at foreign leases."""
        with self.sessions.begin() as session:
            close_if_done(session, ref.job_id)
            elsewhere = leased_elsewhere_for(session, ref)
        if elsewhere is None:
            return report
        retry_in = elsewhere if report.retry_in is None else min(report.retry_in, elsewhere)
        return BatchReport(report.claimed, report.succeeded, report.failed, retry_in)

    def _route_name(self, item: ClaimedItem) -> str | None:
        """The route ingest stored with the item; one stored before routes were (migration
        0008) is routed by its model."""
        if item.route is not None:
            return item.route
        return self.deployments.route_name_for(item.body.get("model"))

    async def _run_route(self, run: BatchRun, job: "_JobFacts", name: str | None,
                         items: list[ClaimedItem]) -> None:
        route = self.deployments.route_named(name)
        if route is not None:
            # Only deployments that serve the job's endpoint (quotaflow/capabilities.py).
            served = serving_route(route, self.deployments, job.url)
            if served is None:
                failure = Failure(FailureCode.UNSUPPORTED_ENDPOINT, unserved_message(
                    (self.deployments.deployments[n] for n in route.names), job.url))
                for item in items:
                    run.finish(item, failure)
                return
            route = served
        if route is not None and any(self.deployments.deployments[n].is_batch
                                     for n in route.names):
            items = self._to_provider_batch(run, job, route, items)
            realtime = route.realtime(self.deployments)
            if realtime is None:
                for item in items:
                    run.finish(item, Failure(
                        FailureCode.NO_DEPLOYMENT,
                        f"route {name!r} names only provider batch deployments, which take "
                        "bulk jobs' lines only (README, \"Provider batch APIs\"); submit on "
                        "the bulk queue or add a realtime fallback"))
                return
            route = realtime
            if not items:
                return
        if route is None:  # the deployments file changed since the job was made
            for item in items:
                run.finish(item, Failure(
                    FailureCode.NO_DEPLOYMENT,
                    f"no deployment serves model {item.body.get('model')!r} (route {name!r} "
                    "is no longer in the deployments file)"))
            return
        await self.admitter.run_route(run, route, items)

    def _to_provider_batch(self, run: BatchRun, job: "_JobFacts", route: Route,
                           items: list[ClaimedItem]) -> list[ClaimedItem]:
        """Queue a bulk job's lines for the route's provider batch deployment; the lines
        left to call now (other jobs' lines, and lines that fell back from a batch)."""
        target = route.batch_deployment(self.deployments)
        if target is None or job.queue != QUEUE_BULK or not self.provider_batches:
            return items
        if not serves(target, job.url):
            return items  # e.g. Message Batches answer chat only: realtime decides
        back = pbatch_enqueue.fell_back(self.sessions, run.ref.job_id,
                                        [item.line_no for item in items])
        pbatch_enqueue.enqueue(self.sessions, run.ref.job_id, run.owner, job.url, target,
                               [item for item in items if item.line_no not in back])
        return [item for item in items if item.line_no in back]

    @staticmethod
    async def _flush_when_due(run: BatchRun) -> None:
        """Settle and store a chunk at a time while the batch runs, not only at its end."""
        while True:
            await asyncio.sleep(FLUSH_TICK_S)
            if run.feedback.due():
                run.feedback.flush()
            if run.writer.due():
                write = asyncio.ensure_future(run.writer.flush())
                write.add_done_callback(_retrieve)
                try:
                    await asyncio.shield(write)
                except asyncio.CancelledError:
                    raise
                except Exception:  # kept for the next try; the batch's end raises it
                    await asyncio.sleep(WRITE_RETRY_S)


def _best_effort(operation: Callable[[str], None], tenant: str) -> None:
    """Fair shares are bookkeeping: a Redis that is down must not fail a batch."""
    try:
        operation(tenant)
    except ServiceUnavailable:
        log.warning("fair shares skipped: the limiter's Redis is unreachable")


def _retrieve(task: "asyncio.Future[None]") -> None:
    """A shielded write that fails after its batch moved on has its chunk back in the
    buffer, for the batch's last write; its exception needs no other reader."""
    if not task.cancelled():
        task.exception()


async def _store_all(run: BatchRun) -> None:
    """Write every answer the batch holds, waiting out a database that is away (for up
    to KEEP_ANSWERS_S): an answer dropped here would be paid for again when its
    request is sent a second time."""
    delay, deadline = WRITE_RETRY_S, time.monotonic() + KEEP_ANSWERS_S
    while True:
        try:
            await run.writer.flush()
            return
        except OperationalError as exc:
            if time.monotonic() > deadline:
                raise
            log.warning("storing %d answers of %s failed (%s); trying again in %.0fs",
                        run.writer.waiting, run.ref.job_id, exc.__class__.__name__, delay,
                        extra=run.context)
            await asyncio.sleep(delay)
            delay = min(2 * delay, MAX_WRITE_RETRY_S)

"""Run one batch of a job: hooks -> claim -> route -> admit and call -> store -> report.

The Celery task and the embedded runner both come through BatchExecutor. The loop is
admission.py and attempts.py (first admissions and retries, through one gate: gate.py);
lease renewal, feedback and result writing run beside it (beside.py). The policies that
vary from run to run are the run's hooks (hooks.py), chosen in one place (policies/).
"""

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from quotaflow.budget.circuit import CircuitBreaker, LocalCircuitBreaker
from quotaflow.budget.fair_share import FairShare
from quotaflow.budget.limiter import Limiter
from quotaflow.budget.routing import Router
from quotaflow.config import Settings
from quotaflow.deployments.catalog import Deployments
from quotaflow.dispatch.queues import BatchRef
from quotaflow.execution import loops, routes
from quotaflow.execution.admission import Admitter
from quotaflow.execution.attempts import Caller
from quotaflow.execution.batch import BatchReport, BatchRun
from quotaflow.execution.beside import beside
from quotaflow.execution.bookends import Bookends
from quotaflow.execution.facts import JobFacts, JobFactsCache
from quotaflow.execution.feedback import Feedback
from quotaflow.execution.fencing import Fence
from quotaflow.execution.flushing import store_all
from quotaflow.execution.gate import Gate
from quotaflow.execution.hooks import Hooks
from quotaflow.execution.loops import PROVIDERS, ProviderPool
from quotaflow.execution.policies import Policies
from quotaflow.execution.prepare import Preparer
from quotaflow.execution.retries import RetryPolicy
from quotaflow.execution.stopping import JobWatch, SharedReads
from quotaflow.execution.writer import ResultWriter
from quotaflow.providers.priority import current_queue
from quotaflow.results.leases import ClaimedItem

log = logging.getLogger(__name__)


class BatchExecutor:
    """Runs batches against the configured deployments; one per worker process.

    `breaker` must be shared by every worker (the Redis one) in a cluster; the
    in-process one serves the embedded runner. `defer` says whether a long wait
    for budget may hand items back to the queue (Celery) or must be slept
    through (the embedded runner); `provider_batches` (default: `defer`) whether
    bulk lines may go to provider batch deployments (only workers poll them);
    `metrics` whether its runs count for Prometheus (only where something serves the
    counts: execution/policies/metrics_hook.py).
    """

    def __init__(self, sessions: sessionmaker[Session], deployments: Deployments,
                 limiter: Limiter, settings: Settings, breaker: CircuitBreaker | None = None,
                 defer: bool = True, providers: ProviderPool = PROVIDERS,
                 provider_batches: bool | None = None, fair: FairShare | None = None,
                 metrics: bool = True) -> None:
        self.sessions, self.deployments, self.settings = sessions, deployments, settings
        self.limiter, self.breaker = limiter, breaker or LocalCircuitBreaker()
        self.lease, self.providers = timedelta(seconds=settings.lease_s), providers
        self.jobs = JobFactsCache(sessions)
        self.job_reads = SharedReads()  # its batches' reads of their jobs' status
        self.bookends = Bookends(sessions, self.lease)
        self.policies = Policies(sessions, deployments, settings, fair,
                                 defer if provider_batches is None else provider_batches,
                                 metrics)
        gate = Gate(Router(deployments, limiter, self.breaker), limiter,
                    Preparer(deployments, providers))
        self.admitter = Admitter(
            sessions, deployments, gate, Caller(gate),
            settings, settings.max_inline_wait_s if defer else float("inf"),
            settings.task_soft_time_limit / 2 if defer else float("inf"))

    def run(self, ref: BatchRef, on_item: Callable[[bool], None] | None = None) -> BatchReport:
        """Run the batch on this thread's long-lived loop (its connections stay open)."""
        return loops.run(self.run_async(ref, on_item))

    async def aclose(self) -> None:
        """Close the running loop's provider connections."""
        await self.providers.aclose()

    async def run_async(self, ref: BatchRef,
                        on_item: Callable[[bool], None] | None = None) -> BatchReport:
        job = self.jobs.get(ref.job_id)
        hooks = self.policies.hooks_for(job)
        if (back_in := hooks.come_back_in()) is not None:
            return BatchReport(0, 0, 0, back_in)  # a hook gave way: nothing claimed
        owner = uuid.uuid4().hex
        claimed_at = time.monotonic()
        items = self.bookends.claim(ref, owner)
        if not items:
            return self.bookends.report(ref, BatchReport(0, 0, 0))
        run = self._new_run(ref, owner, job, hooks, on_item)
        # The calls' tasks copy it: an engine that schedules by priority reads it there.
        current_queue.set(job.queue)
        run.fence = Fence(self.sessions, ref.job_id, owner, self.lease, claimed_at)
        try:
            await self._call(run, hooks.to_call(run, items))
        finally:
            try:
                hooks.stop(run)
            finally:
                await store_all(run)  # answers are kept, whatever ended the batch
        report = BatchReport(len(items), run.writer.succeeded, run.writer.failed, run.retry_in)
        log.info("batch %s lines %d-%d: %d claimed, %d succeeded, %d failed", ref.job_id,
                 ref.first_line, ref.last_line, report.claimed, report.succeeded,
                 report.failed, extra={**run.context, **asdict(report)})
        return self.bookends.report(ref, report)

    def _new_run(self, ref: BatchRef, owner: str, job: JobFacts, hooks: Hooks,
                 on_item: Callable[[bool], None] | None) -> BatchRun:
        settings = self.settings
        policy = RetryPolicy(max_attempts=job.max_attempts or settings.provider_max_attempts,
                             max_wait_s=settings.max_retry_after_s)
        return BatchRun(ref, owner, job.url, settings.floor_for(job.queue), policy,
                        ResultWriter(self.sessions, ref.job_id, on_item, job.has_duplicates,
                                     on_stored=hooks.on_stored),
                        Feedback(self.limiter, self.breaker),
                        JobWatch(self.sessions, ref.job_id, hooks.stop_check,
                                 shared=self.job_reads),
                        output_format=job.output_format, hooks=hooks, caps=job.caps)

    async def _call(self, run: BatchRun, items: list[ClaimedItem]) -> None:
        """Admit and call the items, a route at a time, with their leases kept and their
        feedback and answers flushed as they come."""
        by_route: dict[str | None, list[ClaimedItem]] = {}
        for item in items:
            by_route.setdefault(routes.route_name(self.deployments, item), []).append(item)
        async with beside(run, self.sessions, self.lease):
            await asyncio.gather(*(self._call_route(run, name, group)
                                   for name, group in by_route.items()))

    async def _call_route(self, run: BatchRun, name: str | None,
                          items: list[ClaimedItem]) -> None:
        route = routes.serving(run, self.deployments, name, items)
        if route is None:
            return
        items = run.hooks.to_admit(run, route, items)
        route = routes.realtime(run, self.deployments, route, name, items)
        if route is not None and items:
            await self.admitter.run_route(run, route, items)

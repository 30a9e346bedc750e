"""Run one batch of a job: claim -> acquire budget -> call -> settle -> store -> finish.

The Celery task and the embedded runner both come through BatchExecutor.
Every call first takes its cost from the deployment's shared budget and is
settled against real usage afterwards; claiming and storing live in leases.py.
"""

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.config import Deployment, Deployments, Settings
from quotaflow.errors import (
    ConfigError,
    PermanentProviderError,
    ProviderError,
    ServiceUnavailable,
)
from quotaflow.jobs import BatchRef, finish_if_done
from quotaflow.leases import (
    ClaimedItem,
    Failure,
    Outcome,
    claim,
    leased_elsewhere_for,
    release,
    renew,
    store,
)
from quotaflow.models import Job, utcnow
from quotaflow.providers import Provider, ProviderResponse, make_provider
from quotaflow.ratelimit import Budget, Limiter, RequestTooLarge, sleep_time
from quotaflow.retries import RetryPolicy
from quotaflow.tokens import admission_tokens

log = logging.getLogger(__name__)

# How long to wait before asking an unreachable limiter again.
LIMITER_DOWN_BACKOFF_S = 5.0
# Without Retry-After, a 429 keeps the whole deployment quiet this long.
DEFAULT_429_PAUSE_S = 1.0
# A wait computed from the refill rate ignores refunds that other workers' calls
# will bring back sooner; where usage is reconciled, look again this often.
REFUND_POLL_S = 0.05


@dataclass(frozen=True)
class BatchReport:
    """What one run of a batch did; retry_in is set when some items must be run later."""

    claimed: int
    succeeded: int
    failed: int
    retry_in: float | None = None


@dataclass
class _Admitted:
    """An item with its request as sent, its admission cost, and its admission's slot."""

    item: ClaimedItem
    body: dict[str, Any]
    cost: int
    slot: int = 0


@dataclass
class _BatchRun:
    """The state of one batch run: its job, claim owner, providers, and tallies."""

    ref: BatchRef
    owner: str
    url: str
    floor: float
    on_item: Callable[[bool], None] | None
    providers: dict[str, Provider] = field(default_factory=dict)
    counts: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})
    retry_in: float | None = None

    def provider(self, deployment: Deployment) -> Provider:
        if deployment.name not in self.providers:
            self.providers[deployment.name] = make_provider(deployment)
        return self.providers[deployment.name]

    def later(self, seconds: float) -> None:
        self.retry_in = seconds if self.retry_in is None else min(self.retry_in, seconds)


class BatchExecutor:
    """Runs batches against the configured deployments; one per worker process.

    `defer` says whether a long wait for budget may hand items back to the
    queue (Celery) or must be slept through (the embedded runner).
    """

    def __init__(self, sessions: sessionmaker[Session], deployments: Deployments,
                 limiter: Limiter, settings: Settings, defer: bool = True) -> None:
        self.sessions = sessions
        self.deployments = deployments
        self.limiter = limiter
        self.settings = settings
        self.lease = timedelta(seconds=settings.lease_seconds)
        self.policy = RetryPolicy(max_attempts=settings.provider_max_attempts)
        self.max_inline_wait = settings.max_inline_wait_s if defer else float("inf")

    def run(self, ref: BatchRef, on_item: Callable[[bool], None] | None = None) -> BatchReport:
        return asyncio.run(self.run_async(ref, on_item))

    async def run_async(self, ref: BatchRef,
                        on_item: Callable[[bool], None] | None = None) -> BatchReport:
        owner = uuid.uuid4().hex
        items = claim(self.sessions, ref, owner, self.lease)
        with self.sessions() as session:
            url, queue = session.execute(
                select(Job.endpoint, Job.queue).where(Job.id == ref.job_id)).one()
        run = _BatchRun(ref, owner, url, self.settings.floor_for(queue), on_item)
        groups: dict[str, list[ClaimedItem]] = {}
        for item in items:
            deployment = self.deployments.for_model(item.body.get("model"))
            if deployment is None:
                self._finish(run, item, Failure(
                    "no_deployment", f"no deployment serves model {item.body.get('model')!r}"))
            else:
                groups.setdefault(deployment.name, []).append(item)
        keeper = asyncio.create_task(self._keep_leases(ref, owner))
        try:
            await asyncio.gather(*(self._run_group(run, self.deployments.deployments[name], group)
                                   for name, group in groups.items()))
        finally:
            keeper.cancel()
            for provider in run.providers.values():
                await provider.aclose()
        finish_if_done(self.sessions, ref.job_id)
        elsewhere = leased_elsewhere_for(self.sessions, ref)
        if elsewhere is not None:
            run.later(elsewhere)
        return BatchReport(len(items), run.counts[True], run.counts[False], run.retry_in)

    async def _keep_leases(self, ref: BatchRef, owner: str) -> None:
        """Renew this batch's leases at a third of their length while it runs."""
        while True:
            await asyncio.sleep(self.lease.total_seconds() / 3)
            renew(self.sessions, ref.job_id, owner, self.lease)

    def _finish(self, run: _BatchRun, item: ClaimedItem, outcome: Outcome) -> None:
        ok = store(self.sessions, run.ref.job_id, item, outcome)
        run.counts[ok] += 1
        if run.on_item is not None:
            run.on_item(ok)

    async def _run_group(self, run: _BatchRun, deployment: Deployment,
                         items: list[ClaimedItem]) -> None:
        """Admit the group's items in order, as budget allows, and call each once admitted."""
        budget = Budget.of(deployment)
        try:
            run.provider(deployment)
        except ConfigError as exc:  # e.g. the key's environment variable is not set
            for item in items:
                self._finish(run, item, Failure("configuration_error", str(exc)))
            return
        waiting: list[_Admitted] = []
        for item in items:
            body = {**item.body, "model": deployment.model}
            cost = admission_tokens(run.url, body, deployment.default_max_tokens)
            try:
                budget.check_fits(cost)
            except RequestTooLarge as exc:
                self._finish(run, item, Failure("request_too_large", str(exc)))
                continue
            waiting.append(_Admitted(item, body, cost))
        calls: set[asyncio.Task[None]] = set()
        while waiting:
            calls = {call for call in calls if not call.done()}
            free = deployment.max_concurrency - len(calls)
            if free <= 0:
                # Admit only what can be sent at once: budget taken for a request that
                # then queues here would be refill the provider never sees.
                await asyncio.wait(calls, return_when=asyncio.FIRST_COMPLETED)
                continue
            asked = waiting[:free]
            try:
                admission = self.limiter.acquire(budget, [a.cost for a in asked], run.floor)
            except ServiceUnavailable as exc:
                log.warning("%s; giving %d items back to the queue", exc, len(waiting))
                admission = None
            admitted = asked[:admission.admitted] if admission else []
            waiting = waiting[len(admitted):]
            for entry in admitted:
                entry.slot = admission.slot
                calls.add(asyncio.create_task(self._call(run, deployment, budget, entry)))
            if not waiting or (admission and admission.admitted == len(asked)):
                continue
            wait = admission.wait_s if admission else LIMITER_DOWN_BACKOFF_S
            # Refunds of calls in flight will shorten a reconciling deployment's wait:
            # keep polling rather than handing the batch back.
            refunds_due = bool(admission and admission.tokens_in_flight > 0
                               and deployment.reconcile_usage)
            if admission is None or (wait > self.max_inline_wait and not refunds_due):
                countdown = min(wait, self.settings.max_countdown_s)
                queued_until = utcnow() + timedelta(
                    seconds=countdown + self.settings.queue_patience_s)
                release(self.sessions, run.ref.job_id, run.owner, [a.item for a in waiting],
                        queued_until)
                run.later(countdown)
                break
            await asyncio.sleep(_poll(deployment, wait))
        await asyncio.gather(*calls)

    async def _call(self, run: _BatchRun, deployment: Deployment, budget: Budget,
                    admitted: _Admitted) -> None:
        outcome = await self._attempts(run, run.provider(deployment), deployment, budget,
                                       admitted)
        self._finish(run, admitted.item, outcome)

    async def _attempts(self, run: _BatchRun, provider: Provider, deployment: Deployment,
                        budget: Budget, admitted: _Admitted) -> Outcome:
        """The first attempt is already paid for; every retry pays again before it goes."""
        last: ProviderError | None = None
        for attempt in range(1, self.policy.max_attempts + 1):
            if attempt > 1:
                admitted.slot = await self._acquire_one(deployment, budget, admitted.cost,
                                                        run.floor)
            response: ProviderResponse | None = None
            try:
                response = await provider.send(run.url, admitted.body)
            except PermanentProviderError as exc:
                return Failure("provider_error", f"{exc} (attempt {attempt}, not retried)",
                               exc.status_code, exc.body)
            except ProviderError as exc:
                last = exc
                if exc.status_code == 429:
                    self._feedback(self.limiter.drain, budget,
                                   exc.retry_after or DEFAULT_429_PAUSE_S)
            finally:
                # Every admitted attempt is settled once, whatever became of it; a
                # failed call refunds nothing, since the provider may have counted it.
                self._settle(deployment, budget, admitted, response)
            if response is not None:
                return response
            if attempt < self.policy.max_attempts:
                await asyncio.sleep(self.policy.delay(attempt, last.retry_after))
        assert last is not None
        return Failure("provider_error",
                       f"{last} (gave up after {self.policy.max_attempts} attempts)",
                       last.status_code, last.body)

    async def _acquire_one(self, deployment: Deployment, budget: Budget, cost: int,
                           floor: float) -> int:
        while True:
            try:
                admission = self.limiter.acquire(budget, [cost], floor)
            except ServiceUnavailable as exc:
                log.warning("%s; retrying in %.0fs", exc, LIMITER_DOWN_BACKOFF_S)
                await asyncio.sleep(LIMITER_DOWN_BACKOFF_S)
                continue
            if admission.admitted:
                return admission.slot
            await asyncio.sleep(_poll(deployment, admission.wait_s))

    def _settle(self, deployment: Deployment, budget: Budget, admitted: _Admitted,
                response: ProviderResponse | None) -> None:
        """Settle the admission estimate against real usage, then heed the provider's headers."""
        used = 0 if response is None else response.prompt_tokens + response.completion_tokens
        refund = float(admitted.cost - used) if deployment.reconcile_usage and used > 0 else 0.0
        self._feedback(self.limiter.settle, budget, admitted.slot, admitted.cost, refund)
        if response is None:
            return
        # Where usage is reconciled, a token count in the headers races with the
        # refunds of other calls (an older header would undo a newer refund), so
        # only the requests bucket is clamped; 429s still drain both.
        tokens = None if deployment.reconcile_usage else response.remaining_tokens
        if response.remaining_requests is not None or tokens is not None:
            self._feedback(self.limiter.clamp, budget, response.remaining_requests, tokens)

    @staticmethod
    def _feedback(operation: Callable[..., None], *args: Any) -> None:
        """Feedback is best effort: a limiter that is down must not fail a finished call."""
        try:
            operation(*args)
        except ServiceUnavailable as exc:
            log.warning("limiter feedback skipped: %s", exc)


def _poll(deployment: Deployment, wait_s: float) -> float:
    """How long to sleep before asking the limiter again."""
    pause = sleep_time(wait_s)
    return min(pause, REFUND_POLL_S) if deployment.reconcile_usage else pause

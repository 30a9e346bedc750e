"""Run one batch of a job: claim -> route -> acquire budget -> call -> settle -> store.

The Celery task and the embedded runner both come through BatchExecutor.
Every chunk of requests goes to the deployment the router picks (the least
used of its model's group, never one cooling down or with an open circuit),
first takes its cost from that deployment's shared budget, and is settled
against real usage afterwards. A failed attempt is routed again: a 429 keeps
it off the deployments sharing that quota, a failure counts against the
deployment's circuit. Claiming and storing live in leases.py.
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

from quotaflow.circuit import CircuitBreaker, LocalCircuitBreaker
from quotaflow.config import Deployment, Deployments, Route, Settings
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
from quotaflow.reuse import earlier_answers
from quotaflow.routing import Router
from quotaflow.tokens import admission_tokens

log = logging.getLogger(__name__)

# How long to wait before asking an unreachable limiter again.
LIMITER_DOWN_BACKOFF_S = 5.0
# Without Retry-After, a 429 keeps the whole deployment quiet this long.
DEFAULT_429_PAUSE_S = 1.0
# A wait computed from the refill rate ignores refunds that other workers' calls
# will bring back sooner; where usage is reconciled, look again this often.
REFUND_POLL_S = 0.05
# Requests admitted to one deployment per routing decision, where a route has several.
GROUP_CHUNK = 4
# The longest one sleep while no deployment is available: circuits and blocks can
# end early (a probe succeeds), so look again at least this often.
MAX_ROUTE_WAIT_S = 5.0

@dataclass(frozen=True)
class BatchReport:
    """What one run of a batch did; retry_in is set when some items must be run later."""

    claimed: int
    succeeded: int
    failed: int
    retry_in: float | None = None


@dataclass
class _Admitted:
    """An item prepared for one deployment: the request as sent there, its admission
    cost, and the slot of the admission that paid for it."""

    item: ClaimedItem
    deployment: Deployment
    budget: Budget
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
    policy: RetryPolicy
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

    `breaker` must be shared by every worker (the Redis one) in a cluster; the
    in-process one serves the embedded runner. `defer` says whether a long wait
    for budget may hand items back to the queue (Celery) or must be slept
    through (the embedded runner).
    """

    def __init__(self, sessions: sessionmaker[Session], deployments: Deployments,
                 limiter: Limiter, settings: Settings, breaker: CircuitBreaker | None = None,
                 defer: bool = True) -> None:
        self.sessions = sessions
        self.deployments = deployments
        self.limiter = limiter
        self.breaker = breaker or LocalCircuitBreaker()
        self.router = Router(deployments, limiter, self.breaker)
        self.settings = settings
        self.lease = timedelta(seconds=settings.lease_seconds)
        self.max_inline_wait = settings.max_inline_wait_s if defer else float("inf")
        self._budgets = {d.name: Budget.of(d) for d in deployments.deployments.values()}

    def run(self, ref: BatchRef, on_item: Callable[[bool], None] | None = None) -> BatchReport:
        return asyncio.run(self.run_async(ref, on_item))

    async def run_async(self, ref: BatchRef,
                        on_item: Callable[[bool], None] | None = None) -> BatchReport:
        owner = uuid.uuid4().hex
        items = claim(self.sessions, ref, owner, self.lease)
        with self.sessions() as session:
            url, queue, max_attempts, tenant = session.execute(
                select(Job.endpoint, Job.queue, Job.max_attempts, Job.tenant)
                .where(Job.id == ref.job_id)).one()
        policy = RetryPolicy(max_attempts=max_attempts or self.settings.provider_max_attempts)
        run = _BatchRun(ref, owner, url, self.settings.floor_for(queue), policy, on_item)
        reused = (earlier_answers(self.sessions, ref.job_id, tenant, items)
                  if self.settings.dedup_across_jobs else {})
        by_model: dict[str | None, list[ClaimedItem]] = {}
        for item in items:
            if item.line_no in reused:
                self._finish(run, item, reused[item.line_no])
            else:
                by_model.setdefault(item.body.get("model"), []).append(item)
        keeper = asyncio.create_task(self._keep_leases(ref, owner))
        try:
            await asyncio.gather(*(self._run_model(run, model, group)
                                   for model, group in by_model.items()))
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
        ok, shared = store(self.sessions, run.ref.job_id, item, outcome)
        run.counts[ok] += 1 + shared
        if run.on_item is not None:
            for _ in range(1 + shared):
                run.on_item(ok)

    def _prepare(self, run: _BatchRun, deployment: Deployment,
                 item: ClaimedItem) -> _Admitted | Failure:
        """The item as `deployment` would receive it, or why it cannot go there."""
        try:
            run.provider(deployment)
        except ConfigError as exc:  # e.g. the key's environment variable is not set
            return Failure("configuration_error", str(exc))
        body = {**item.body, "model": deployment.model}
        cost = admission_tokens(run.url, body, deployment.default_max_tokens)
        budget = self._budgets[deployment.name]
        try:
            budget.check_fits(cost)
        except RequestTooLarge as exc:
            return Failure("request_too_large", str(exc))
        return _Admitted(item, deployment, budget, body, cost)

    def _prepare_chunk(self, run: _BatchRun, deployment: Deployment,
                       waiting: list[ClaimedItem], size: int) -> list[_Admitted]:
        """The next `size` waiting items prepared for `deployment`; those that cannot go
        there fail now and leave `waiting`, so the result is its head, in order."""
        asked: list[_Admitted] = []
        for item in waiting[:size]:
            prepared = self._prepare(run, deployment, item)
            if isinstance(prepared, Failure):
                waiting.remove(item)
                self._finish(run, item, prepared)
            else:
                asked.append(prepared)
        return asked

    async def _run_model(self, run: _BatchRun, model: str | None,
                         items: list[ClaimedItem]) -> None:
        route = self.deployments.route_for(model)
        if route is None:
            for item in items:
                self._finish(run, item, Failure(
                    "no_deployment", f"no deployment serves model {model!r}"))
            return
        await self._run_route(run, route, items)

    async def _run_route(self, run: _BatchRun, route: Route, items: list[ClaimedItem]) -> None:
        """Admit the items in order, a chunk at a time, each chunk to the deployment the
        router picks as budget allows; call each item once admitted."""
        waiting = list(items)
        calls: dict[str, set[asyncio.Task[None]]] = {}
        while waiting:
            for name in calls:
                calls[name] = {call for call in calls[name] if not call.done()}
            # Admit only what can be sent at once: budget taken for a request that then
            # queues here would be refill the provider never sees.
            busy = {name for name, flying in calls.items()
                    if len(flying) >= self.deployments.deployments[name].max_concurrency}
            try:
                choice = self.router.choose(route, exclude=busy)
            except ServiceUnavailable as exc:
                log.warning("%s; giving %d items back to the queue", exc, len(waiting))
                self._defer(run, waiting, LIMITER_DOWN_BACKOFF_S)
                break
            if choice.deployment is None:
                if busy:
                    await asyncio.wait(set().union(*calls.values()),
                                       return_when=asyncio.FIRST_COMPLETED)
                elif not await self._pause(run, waiting, choice.wait_s, refunds_due=False):
                    break
                continue
            deployment = choice.deployment
            free = 1 if choice.probe else (
                deployment.max_concurrency - len(calls.get(deployment.name, ())))
            if len(route.names) > 1:
                # Where there is a choice, decide often: every batch run reads the same
                # levels, and large chunks would all land on the least used deployment.
                free = min(free, GROUP_CHUNK)
            asked = self._prepare_chunk(run, deployment, waiting, free)
            if not asked:
                continue
            try:
                admission = self.limiter.acquire(asked[0].budget, [a.cost for a in asked],
                                                 run.floor)
            except ServiceUnavailable as exc:
                log.warning("%s; giving %d items back to the queue", exc, len(waiting))
                self._defer(run, waiting, LIMITER_DOWN_BACKOFF_S)
                break
            del waiting[:admission.admitted]
            for entry in asked[:admission.admitted]:
                entry.slot = admission.slot
                calls.setdefault(deployment.name, set()).add(
                    asyncio.create_task(self._call(run, route, entry)))
            if admission.admitted == len(asked):
                continue
            # Refunds of calls in flight will shorten a reconciling deployment's wait:
            # keep polling rather than handing the batch back.
            refunds_due = admission.tokens_in_flight > 0 and deployment.reconcile_usage
            if not await self._pause(run, waiting, admission.wait_s, refunds_due, deployment):
                break
        await asyncio.gather(*(call for flying in calls.values() for call in flying))

    async def _pause(self, run: _BatchRun, waiting: list[ClaimedItem], wait_s: float,
                     refunds_due: bool, deployment: Deployment | None = None) -> bool:
        """Sleep through a short wait (True), or hand the items back to the queue (False)."""
        if wait_s > self.max_inline_wait and not refunds_due:
            self._defer(run, waiting, wait_s)
            return False
        pause = _poll(deployment, wait_s) if deployment else sleep_time(wait_s)
        await asyncio.sleep(min(pause, MAX_ROUTE_WAIT_S))
        return True

    def _defer(self, run: _BatchRun, waiting: list[ClaimedItem], wait_s: float) -> None:
        """Give unstarted items back, to be run again when their wait is over."""
        countdown = min(wait_s, self.settings.max_countdown_s)
        queued_until = utcnow() + timedelta(seconds=countdown + self.settings.queue_patience_s)
        release(self.sessions, run.ref.job_id, run.owner, waiting, queued_until)
        run.later(countdown)

    async def _call(self, run: _BatchRun, route: Route, admitted: _Admitted) -> None:
        self._finish(run, admitted.item, await self._attempts(run, route, admitted))

    async def _attempts(self, run: _BatchRun, route: Route, admitted: _Admitted) -> Outcome:
        """The first attempt is already paid for; every retry is routed and pays again."""
        last: ProviderError | None = None
        avoid: frozenset[str] = frozenset()
        attempts = run.policy.max_attempts
        for attempt in range(1, attempts + 1):
            if attempt > 1:
                readmitted = await self._readmit(run, route, admitted.item, avoid)
                if isinstance(readmitted, Failure):
                    return readmitted
                admitted = readmitted
            deployment = admitted.deployment
            response: ProviderResponse | None = None
            try:
                response = await run.provider(deployment).send(run.url, admitted.body)
            except PermanentProviderError as exc:
                return Failure("provider_error", f"{exc} (attempt {attempt}, not retried)",
                               exc.status_code, exc.body, attempt)
            except ProviderError as exc:
                last = exc
                avoid = self._after_failure(deployment, admitted.budget, exc)
            finally:
                # Every admitted attempt is settled once, whatever became of it; a
                # failed call refunds nothing, since the provider may have counted it.
                self._settle(admitted, response)
            if response is not None:
                self._feedback(self.breaker.record_success, deployment)
                return response
            if attempt < attempts:
                await asyncio.sleep(run.policy.delay(attempt, last.retry_after))
        assert last is not None
        return Failure("provider_error", f"{last} (gave up after {attempts} attempts)",
                       last.status_code, last.body, attempts)

    def _after_failure(self, deployment: Deployment, budget: Budget,
                       error: ProviderError) -> frozenset[str]:
        """Tell the limiter or the breaker; the deployments the retry must avoid.

        A 429 is the quota speaking, not a broken deployment: the budget is drained
        for everyone until Retry-After, and deployments sharing that quota are no
        escape. Anything else counts towards opening the deployment's circuit.
        """
        if error.status_code == 429:
            self._feedback(self.limiter.drain, budget, error.retry_after or DEFAULT_429_PAUSE_S)
            return self.router.siblings(deployment)
        self._feedback(self.breaker.record_failure, deployment)
        return frozenset()

    async def _readmit(self, run: _BatchRun, route: Route, item: ClaimedItem,
                       avoid: frozenset[str]) -> _Admitted | Failure:
        """Route a retry and pay for it, waiting as long as no deployment can take it."""
        while True:
            try:
                choice = self.router.choose(route, exclude=avoid)
                if choice.deployment is None:
                    await asyncio.sleep(min(sleep_time(choice.wait_s), MAX_ROUTE_WAIT_S))
                    continue
                prepared = self._prepare(run, choice.deployment, item)
                if isinstance(prepared, Failure):
                    return prepared
                admission = self.limiter.acquire(prepared.budget, [prepared.cost], run.floor)
            except ServiceUnavailable as exc:
                log.warning("%s; retrying in %.0fs", exc, LIMITER_DOWN_BACKOFF_S)
                await asyncio.sleep(LIMITER_DOWN_BACKOFF_S)
                continue
            if admission.admitted:
                prepared.slot = admission.slot
                return prepared
            await asyncio.sleep(min(_poll(choice.deployment, admission.wait_s),
                                    MAX_ROUTE_WAIT_S))

    def _settle(self, admitted: _Admitted, response: ProviderResponse | None) -> None:
        """Settle the admission estimate against real usage, then heed the provider's headers."""
        deployment, budget = admitted.deployment, admitted.budget
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
    def _feedback(operation: Callable[..., Any], *args: Any) -> None:
        """Feedback is best effort: a limiter or breaker that is down must not fail a
        finished call."""
        try:
            operation(*args)
        except ServiceUnavailable as exc:
            log.warning("feedback skipped: %s", exc)


def _poll(deployment: Deployment | None, wait_s: float) -> float:
    """How long to sleep before asking the limiter again."""
    pause = sleep_time(wait_s)
    return min(pause, REFUND_POLL_S) if deployment and deployment.reconcile_usage else pause

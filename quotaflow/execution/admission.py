"""Admit a route's items in order, a chunk at a time, each chunk to the deployment the
router picks, as budget allows (through the gate, gate.py, the way retries take too);
start each item's call once admitted.

Only what can be sent at once is admitted (a deployment's max_concurrency):
budget taken for a request that then queues here would be refill the
provider never sees. A wait longer than max_inline_wait hands the unstarted
items back to the queue with a countdown (Celery), or is slept through
(the embedded runner). A batch that has run longer than `hand_back_after_s` (half of
Celery's soft time limit) hands its unstarted items back to run at once, in another
message: a large batch on a slow deployment (batches grow with the job,
quotaflow/dispatch/batch_sizes.py) never meets the limit that would end it.
"""

import asyncio
import logging
import time
from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from quotaflow.budget.limiter import Admission
from quotaflow.budget.routing import Choice
from quotaflow.config import Settings
from quotaflow.deployments.catalog import Deployments, Route
from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import ServiceUnavailable
from quotaflow.execution.admitted import Admitted
from quotaflow.execution.attempts import Caller
from quotaflow.execution.batch import BatchRun
from quotaflow.execution.flights import Flights
from quotaflow.execution.gate import Gate
from quotaflow.execution.timing import LIMITER_DOWN_BACKOFF_S, MAX_ROUTE_WAIT_S, YIELD_S, poll_time
from quotaflow.models import utcnow
from quotaflow.results.leases import ClaimedItem, end_unsent, release

log = logging.getLogger(__name__)

# Requests admitted to one deployment per routing decision, where a route has several.
GROUP_CHUNK = 4
# With calls in flight, admit once at least max_concurrency / GATHER_FRACTION slots are
# free, or after waiting GATHER_S for them: short against any provider's latency, long
# enough for an instant one's answers to come back together.
GATHER_FRACTION = 4
GATHER_S = 0.002


class Admitter:
    """Runs a route's items through the limiter and into calls."""

    def __init__(self, sessions: sessionmaker[Session], deployments: Deployments, gate: Gate,
                 caller: Caller, settings: Settings, max_inline_wait: float,
                 hand_back_after_s: float = float("inf")) -> None:
        self.sessions = sessions
        self.deployments = deployments
        self.gate = gate
        self.caller = caller
        self.settings = settings
        self.max_inline_wait = max_inline_wait
        self.hand_back_after_s = hand_back_after_s

    async def run_route(self, run: BatchRun, route: Route, items: list[ClaimedItem]) -> None:
        waiting = list(items)
        calls = Flights()
        try:
            await self._admit(run, route, waiting, calls)
        finally:
            # Calls already sent finish and are stored, whatever ended the loop.
            await calls.finish()

    async def _admit(self, run: BatchRun, route: Route, waiting: list[ClaimedItem],
                     calls: Flights) -> None:
        gathered = False
        while waiting:
            if self._stopped(run, waiting) or self._overran(run, waiting) or self._gave_way(
                    run, waiting):
                break
            busy = self._busy(route, calls)
            try:
                choice = self.gate.choose(route, busy)
            except ServiceUnavailable as exc:
                log.warning("%s; giving %d items back to the queue", exc, len(waiting),
                            extra=run.context)
                self._defer(run, waiting, LIMITER_DOWN_BACKOFF_S)
                break
            if choice.deployment is None:
                if not await self._closed_off(run, waiting, choice, calls, busy):
                    break
                continue
            deployment = choice.deployment
            flying = calls.on(deployment.name)
            free = _free_slots(choice, route, flying)
            if not (choice.probe or gathered) and flying and free < min(
                    len(waiting), max(1, deployment.max_concurrency // GATHER_FRACTION)):
                # A slot or two just came free: let a few more calls end first, so one
                # admission (one round trip to the limiter) pays for several requests.
                await calls.none_left_on(deployment.name, GATHER_S)
                gathered = True
                continue
            gathered = False
            if not self._fenced(run, waiting):
                break
            asked = self._prepare_chunk(run, deployment, waiting, free)
            if not asked:
                continue
            admission = await self._acquire(run, waiting, asked)
            if admission is None:
                break
            del waiting[:admission.admitted]
            for entry in asked[:admission.admitted]:
                calls.start(deployment.name, self.caller.call(run, route, entry))
            if admission.admitted == len(asked):
                continue
            # Refunds of calls in flight will shorten a refunding deployment's wait:
            # keep polling rather than handing the batch back.
            if not await self._pause(run, waiting, admission.wait_s, admission.refunds_due):
                break

    async def _acquire(self, run: BatchRun, waiting: list[ClaimedItem],
                       asked: list[Admitted]) -> Admission | None:
        """The limiter's answer for the chunk, once the run's hooks let it ask (none
        admitted while a hook has it wait: the fair share's, while the tenant is ahead of
        the others); None: the items went back to the queue."""
        hooks = run.hooks
        if hooks.before_acquire and (wait_s := hooks.wait_first(asked[0].budget)) is not None:
            if await self._pause(run, waiting, wait_s, refunds_due=False):
                return Admission(0, 0.0)
            return None
        try:
            admission = self.gate.acquire(run, asked)
        except ServiceUnavailable as exc:
            log.warning("%s; giving %d items back to the queue", exc, len(waiting),
                        extra=run.context)
            self._defer(run, waiting, LIMITER_DOWN_BACKOFF_S)
            return None
        if admission.admitted:
            admitted, waited_s = asked[:admission.admitted], time.monotonic() - run.started
            for hook in hooks.chunk_admitted:
                hook(admitted, waited_s)
        if admission.capped:
            for capped in hooks.capped:
                capped(asked[0].budget)
        return admission

    async def _closed_off(self, run: BatchRun, waiting: list[ClaimedItem], choice: Choice,
                          calls: Flights, busy: set[str]) -> bool:
        """No deployment of the route takes a request now: wait for one (True), or hand
        the items back to the queue (False)."""
        if busy:
            await calls.one_ends()
        elif calls:
            # Closed off (an open circuit, no budget) with calls out: one of them may
            # change that when it ends, as the probe of a half-open circuit closes it by
            # succeeding. Wait for one (a second at most, to notice a cancel) and report
            # it, rather than hand the batch back for the probe's whole timeout.
            await calls.one_ends(max(0.01, min(choice.wait_s, MAX_ROUTE_WAIT_S)))
            run.feedback.flush()
        else:
            return await self._pause(run, waiting, choice.wait_s, refunds_due=False)
        return True

    @staticmethod
    def _fenced(run: BatchRun, waiting: list[ClaimedItem]) -> bool:
        """Drop the waiting items whose lease passed to another worker (this one was
        stopped longer than the lease: fencing.py); whether any are left to admit."""
        if run.fence is None or run.fence.sure():
            return True
        held = run.fence.held(item.line_no for item in waiting)
        waiting[:] = [item for item in waiting if item.line_no in held]
        return bool(waiting)

    def _stopped(self, run: BatchRun, waiting: list[ClaimedItem]) -> bool:
        """End the unsent items of a job that was cancelled or expired meanwhile."""
        ended = run.watch.ended()
        if ended:
            end_unsent(self.sessions, run.ref.job_id, run.owner, waiting, ended)
            waiting.clear()
        return ended is not None

    def _overran(self, run: BatchRun, waiting: list[ClaimedItem]) -> bool:
        """Hand the unsent items back to run at once elsewhere, past the batch's time."""
        ran_s = time.monotonic() - run.started
        if ran_s <= self.hand_back_after_s:
            return False
        log.info("batch ran %.0fs: its %d unsent items go back to the queue", ran_s,
                 len(waiting), extra=run.context)
        self._defer(run, waiting, 0.0)
        return True

    def _gave_way(self, run: BatchRun, waiting: list[ClaimedItem]) -> bool:
        """Another route of the batch gave its slot away: hand these items back too."""
        if run.giving_way:
            self._defer(run, waiting, YIELD_S)
        return run.giving_way

    def _busy(self, route: Route, calls: Flights) -> set[str]:
        """The route's deployments with no call to spare."""
        deployments = self.deployments.deployments
        return {name for name in route.names
                if calls.on(name) >= deployments[name].max_concurrency}

    def _prepare_chunk(self, run: BatchRun, deployment: Deployment,
                       waiting: list[ClaimedItem], size: int) -> list[Admitted]:
        """The next `size` waiting items prepared for `deployment`; those that cannot go
        there fail now and leave `waiting`, so the result is its head, in order."""
        asked, refused = self.gate.prepare(run, deployment, waiting[:size])
        for item, failure in refused:
            waiting.remove(item)
            run.finish(item, failure)
        return asked

    async def _pause(self, run: BatchRun, waiting: list[ClaimedItem], wait_s: float,
                     refunds_due: bool) -> bool:
        """Sleep through a short wait (True), or hand the items back to the queue (False):
        also when a hook gives way (another tenant's batches wait for a worker: so they
        reach one)."""
        if run.giving_way or (self.max_inline_wait != float("inf") and run.hooks.gives_way()):
            run.giving_way = True  # the batch's other routes hand theirs back too
            self._defer(run, waiting, YIELD_S)
            return False
        if wait_s > self.max_inline_wait and not refunds_due:
            self._defer(run, waiting, wait_s)
            return False
        run.feedback.flush()  # this batch's own refunds count before it asks again
        await asyncio.sleep(min(poll_time(refunds_due, wait_s), MAX_ROUTE_WAIT_S))
        return True

    def _defer(self, run: BatchRun, waiting: list[ClaimedItem], wait_s: float) -> None:
        """Give unstarted items back, to be run again when their wait is over."""
        countdown = min(wait_s, self.settings.max_countdown_s)
        queued_until = utcnow() + timedelta(seconds=countdown + self.settings.defer_grace_s)
        release(self.sessions, run.ref.job_id, run.owner, waiting, queued_until)
        run.later(countdown)


def _free_slots(choice: Choice, route: Route, flying: int) -> int:
    """How many requests the chosen deployment may take now: one for a probe."""
    if choice.probe:
        return 1
    assert choice.deployment is not None
    free = choice.deployment.max_concurrency - flying
    if len(route.names) > 1:
        # Where there is a choice, decide often: every batch run reads the same
        # levels, and large chunks would all land on the least used deployment.
        free = min(free, GROUP_CHUNK)
    return free

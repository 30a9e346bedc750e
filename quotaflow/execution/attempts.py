"""One admitted item's calls: the first is paid for, every retry is routed and pays again.

A failed attempt is routed again: a 429 keeps it off the deployments sharing
that quota, a failure counts against the deployment's circuit (feedback.py);
the wait between attempts is the retry policy's (quotaflow/execution/retries.py).
"""

import asyncio
import logging
import time

from quotaflow.budget.limiter import Limiter, sleep_time
from quotaflow.budget.routing import Router
from quotaflow.deployments.catalog import Route
from quotaflow.errors import (
    EngineStopped,
    PermanentProviderError,
    ProviderError,
    ServiceUnavailable,
)
from quotaflow.execution.abortable import CallStopped, aborts_when_stopped, until_stopped
from quotaflow.execution.admitted import Admitted
from quotaflow.execution.batch import BatchRun
from quotaflow.execution.prepare import Preparer
from quotaflow.execution.stopping import CODES
from quotaflow.observe.metrics import error_code
from quotaflow.providers import ProviderResponse
from quotaflow.providers.outcomes import NOT_SENT_BECAUSE, Failure, FailureCode, Outcome, Provenance
from quotaflow.results.leases import ClaimedItem

log = logging.getLogger(__name__)

# How long to wait before asking an unreachable limiter again.
LIMITER_DOWN_BACKOFF_S = 5.0
# The longest one sleep while no deployment is available or budget is short: circuits
# and blocks can end early (a probe succeeds), and a cancel must be noticed soon.
MAX_ROUTE_WAIT_S = 1.0
# A wait computed from the refill rate ignores refunds that other workers' calls
# will bring back sooner; where usage is reconciled, look again this often.
REFUND_POLL_S = 0.05
# An admission not sent within this long (its process was stopped or starved) is given
# up and the call admitted again: the safety margin covers only a request's travel.
STALE_ADMISSION_S = 0.5


class Caller:
    """Calls providers for admitted items, retrying as the run's policy allows."""

    def __init__(self, router: Router, limiter: Limiter, preparer: Preparer) -> None:
        self.router = router
        self.limiter = limiter
        self.preparer = preparer

    async def call(self, run: BatchRun, route: Route, admitted: Admitted) -> None:
        outcome, provenance = await self._attempts(run, route, admitted)
        if outcome is not None:  # None: the item is another worker's now, its to finish
            run.finish(admitted.item, outcome, provenance)

    async def _attempts(self, run: BatchRun, route: Route,
                        admitted: Admitted) -> tuple[Outcome | None, Provenance | None]:
        last: ProviderError | None = None
        avoid: frozenset[str] = frozenset()
        attempts = run.policy.max_attempts
        provenance: Provenance | None = None
        for attempt in range(1, attempts + 1):
            if attempt > 1:
                readmitted = await self._readmit(run, route, admitted.item, avoid)
                if isinstance(readmitted, Failure):
                    return readmitted, provenance
                admitted = readmitted
            deployment = admitted.deployment
            response: ProviderResponse | None = None
            if not run.holds(admitted.item):  # fenced off: its lease passed on (fencing.py)
                run.feedback.unsent(admitted)
                return None, None
            if time.monotonic() - admitted.admitted_at > STALE_ADMISSION_S:
                # Admitted before a stall (a frozen process): the budget it took has been
                # refilled and spent by others since. Sent now, it would take the
                # provider's budget of now, which the limiter gave to someone else. What
                # it took goes back (the provider never saw it), and it is admitted again.
                run.feedback.unsent(admitted)
                readmitted = await self._readmit(run, route, admitted.item, avoid)
                if isinstance(readmitted, Failure):
                    return readmitted, provenance
                admitted = readmitted
                deployment = admitted.deployment
            # Wall clock for the record; the admission's monotonic time is dated from it.
            sent = time.time()
            admitted_at = (sent - (time.monotonic() - admitted.admitted_at)
                           if admitted.admitted_at else sent)
            try:
                response = await self._send(run, admitted)
            except CallStopped as exc:  # the job ended while a local engine had it
                run.feedback.answered(admitted, None)
                return exc.failure, provenance
            except EngineStopped as exc:  # the local engine shut down: the item goes back
                log.info("line %d handed back: %s", admitted.item.line_no, exc,
                         extra=run.context)
                run.feedback.unsent(admitted)
                return None, None  # still leased: it runs again once the lease lapses
            except PermanentProviderError as exc:
                provenance = _provenance(run, admitted, attempt, admitted_at, sent, exc.status_code)
                _log_error(run, admitted, attempt, exc, provenance, "not retried")
                run.feedback.answered(admitted, None)
                return Failure(FailureCode.PROVIDER_ERROR,
                               f"{exc} (attempt {attempt}, not retried)",
                               exc.status_code, exc.body, attempt), provenance
            except ProviderError as exc:
                provenance = _provenance(run, admitted, attempt, admitted_at, sent, exc.status_code)
                _log_error(run, admitted, attempt, exc, provenance,
                           "retrying" if attempt < attempts else "gave up")
                # Retry-After or a reset past QUOTAFLOW_MAX_RETRY_AFTER_S: the retry and
                # the deployment's pause both wait the ceiling instead.
                exc.retry_after = run.policy.provider_wait(exc.retry_after, deployment.name)
                last = exc
                run.feedback.answered(admitted, None)
                quota = run.feedback.failed(admitted, exc)
                avoid = self.router.siblings(deployment) if quota else frozenset()
            else:
                provenance = _provenance(run, admitted, attempt, admitted_at, sent,
                                         response.status_code, response.request_id)
                run.feedback.answered(admitted, response)
                return response, provenance
            if attempt < attempts:
                await asyncio.sleep(run.policy.delay(attempt, last.retry_after))
        assert last is not None
        return Failure(FailureCode.PROVIDER_ERROR,
                       f"{last} (gave up after {attempts} attempts)",
                       last.status_code, last.body, attempts), provenance

    @staticmethod
    async def _send(run: BatchRun, admitted: Admitted) -> ProviderResponse:
        """The call, timed and told to the hooks that count calls (the metrics')."""
        ended = run.hooks.call_ended
        provider = admitted.provider
        call = provider.send(run.url, admitted.body)
        if aborts_when_stopped(provider):
            call = until_stopped(run, admitted.item.line_no, call)
        if not ended:
            return await call
        name = admitted.deployment.name
        started = time.perf_counter()
        try:
            response = await call
        except ProviderError as exc:
            code, latency_s = error_code(exc), time.perf_counter() - started
            for hook in ended:
                hook(name, code, latency_s)
            raise
        latency_s = time.perf_counter() - started
        for hook in ended:
            hook(name, str(response.status_code), latency_s, response.prompt_tokens,
                 response.completion_tokens)
        return response

    async def _readmit(self, run: BatchRun, route: Route, item: ClaimedItem,
                       avoid: frozenset[str]) -> Admitted | Failure:
        """Route a retry and pay for it, waiting as long as no deployment can take it."""
        asked = time.monotonic()
        while True:
            if ended := run.watch.ended():
                return Failure(CODES[ended], f"line {item.line_no}: not sent again because "
                                             f"{NOT_SENT_BECAUSE[ended]}")
            try:
                choice = self.router.choose(route, exclude=avoid)
                if choice.deployment is None:
                    await asyncio.sleep(min(sleep_time(choice.wait_s), MAX_ROUTE_WAIT_S))
                    continue
                prepared = self.preparer.prepare(run.url, choice.deployment, item, run.caps)
                if isinstance(prepared, Failure):
                    return prepared
                run.feedback.flush()  # refunds first: they may be what lets it in
                admission = self.limiter.acquire(prepared.budget, [prepared.cost], run.floor,
                                                 [prepared.input_cost])
            except ServiceUnavailable as exc:
                log.warning("%s; retrying in %.0fs", exc, LIMITER_DOWN_BACKOFF_S,
                            extra={**run.context, "line": item.line_no})
                await asyncio.sleep(LIMITER_DOWN_BACKOFF_S)
                continue
            if admission.admitted:
                prepared.paid(admission)
                waited_s = time.monotonic() - asked
                for hook in run.hooks.retry_admitted:
                    hook(prepared, waited_s)
                return prepared
            await asyncio.sleep(min(poll_time(admission.refunds_due, admission.wait_s),
                                    MAX_ROUTE_WAIT_S))


def poll_time(refunds_due: bool, wait_s: float) -> float:
    """How long to sleep before asking the limiter again: refunds may end a wait early."""
    pause = sleep_time(wait_s)
    return min(pause, REFUND_POLL_S) if refunds_due else pause


def _provenance(run: BatchRun, admitted: Admitted, attempt: int, admitted_at: float, sent: float,
                status: int | None, request_id: str | None = None) -> Provenance:
    """The record of one call just answered; a debug line for an answer only when asked
    for (a line per request at INFO would cost more than the request)."""
    provenance = Provenance(admitted.deployment.name, attempt, admitted_at, sent, time.time())
    if status is not None and status < 400 and log.isEnabledFor(logging.DEBUG):
        log.debug("line %d answered by %s (attempt %d, status %s)", admitted.item.line_no,
                  provenance.deployment, attempt, status,
                  extra=_call_context(run, admitted, attempt, provenance, status, request_id))
    return provenance


def _call_context(run: BatchRun, admitted: Admitted, attempt: int, provenance: Provenance,
                  status: int | None, request_id: str | None) -> dict[str, object]:
    item = admitted.item
    return {**run.context, "line": item.line_no, "custom_id": item.custom_id,
            "deployment": provenance.deployment, "attempt": attempt, "status": status,
            "latency_ms": round(1000 * (provenance.answered_at - provenance.sent_at), 1),
            "provider_request_id": request_id}


def _log_error(run: BatchRun, admitted: Admitted, attempt: int, exc: ProviderError,
               provenance: Provenance, then: str) -> None:
    """One WARNING line per failed call, with the provider's request id where it sent one:
    what an operator searches for, and what the provider's support asks for. Failures are
    few where the budget holds, so the line costs nothing that matters."""
    log.warning("line %d: %s (attempt %d, %s)", admitted.item.line_no, exc, attempt, then,
                extra=_call_context(run, admitted, attempt, provenance, exc.status_code,
                                    exc.request_id))

"""What a provider's answers tell the limiter and the circuit breaker.

Every admitted call is settled once (its estimate against real usage), its
x-ratelimit-remaining headers clamp the buckets, and a success closes the
deployment's circuit count. Doing that per call cost two Lua calls per
request; here settlements wait a few milliseconds and go as one call per
budget, with one clamp (the newest headers) and one success per deployment.
Failures are not buffered: a 429 that says the budget ran out pauses it for
everyone at once and a failure counts towards the circuit at once, after what
was buffered before them, so the order the provider answered in is the order
recorded.

Feedback is best effort: a limiter or breaker that is down must not fail a
finished call (its in-flight tally lapses by itself after the flight timeout).
"""

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from quotaflow.budget.circuit import CircuitBreaker
from quotaflow.budget.limiter import Dating, Limiter, Settlement
from quotaflow.deployments.deployment import Deployment
from quotaflow.deployments.limits import Budget
from quotaflow.errors import ProviderError, ServiceUnavailable
from quotaflow.execution.admitted import Admitted
from quotaflow.providers import ProviderResponse

log = logging.getLogger(__name__)

# Without Retry-After, a 429 keeps the whole deployment quiet this long.
DEFAULT_429_PAUSE_S = 1.0
# Settle once this many calls wait, or once the oldest has waited this long.
FLUSH_SIZE = 64
FLUSH_AFTER_S = 0.02


@dataclass(frozen=True, slots=True)
class _Remaining:
    """A call's x-ratelimit-remaining figures, dated by its admission."""

    requests: float | None
    tokens: float | None
    dating: Dating | None
    inputs: float | None = None  # a split budget's input tokens


@dataclass
class _Pending:
    """A budget's settlements and newest remaining-headers since the last flush."""

    budget: Budget
    settlements: list[Settlement] = field(default_factory=list)
    remaining: _Remaining | None = None


@dataclass
class Feedback:
    limiter: Limiter
    breaker: CircuitBreaker
    _pending: dict[str, _Pending] = field(default_factory=dict)
    _succeeded: dict[str, Deployment] = field(default_factory=dict)
    _count: int = 0
    _since: float = 0.0
    # Rung as the writer's is (writer.py): when the first settlement starts the clock
    # and when a flush falls due by its size.
    bell: asyncio.Event | None = None

    def answered(self, admitted: Admitted, response: ProviderResponse | None) -> None:
        """Record an admitted call's end: settled once, whatever became of it. A failed
        call refunds nothing, since the provider may have counted it. The limiter
        decides whether a refund is spent (the deployment's reconcile_usage, or what
        the provider's headers have shown)."""
        cost, budget = admitted.cost, admitted.budget
        if budget.split:
            settlement = _split_settlement(admitted, response)
        else:
            used = 0 if response is None else response.prompt_tokens + response.completion_tokens
            settlement = Settlement(admitted.slot, cost, float(cost - used) if used > 0 else 0.0,
                                    answered=response is not None)
        pending = self._settle(budget, settlement)
        if response is None:
            return
        self._succeeded[admitted.deployment.name] = admitted.deployment
        if (response.remaining_requests is not None or response.remaining_tokens is not None
                or response.remaining_input_tokens is not None):
            pending.remaining = _Remaining(response.remaining_requests, response.remaining_tokens,
                                           admitted.dating, response.remaining_input_tokens)

    def unsent(self, admitted: Admitted) -> None:
        """Record an admission that was never sent (stale after a stall, or its lease
        passed on): the provider never counted it, so its whole cost goes back, its
        request too, whether or not the provider gives back unused reservations. Kept,
        it would idle the budget for as long as the provider takes to refill it."""
        self._settle(admitted.budget, Settlement(
            admitted.slot, admitted.cost, float(admitted.cost), admitted.input_cost,
            float(admitted.input_cost), answered=False, sent=False))

    def _settle(self, budget: Budget, settlement: Settlement) -> _Pending:
        """Buffer a settlement for the next flush; the budget's pending entry."""
        pending = self._pending.get(budget.name)
        if pending is None:
            pending = self._pending[budget.name] = _Pending(budget)
        if not self._count:
            self._since = time.monotonic()
        self._count += 1
        if self.bell is not None and (self._count == 1 or self._count == FLUSH_SIZE):
            self.bell.set()
        pending.settlements.append(settlement)
        return pending

    def failed(self, admitted: Admitted, error: ProviderError) -> bool:
        """Tell the limiter or the breaker now; True when it was the quota (a 429).

        A 429 is the quota speaking, not a broken deployment. Where its
        x-ratelimit-remaining headers say the budget ran out (not a request left, or
        fewer tokens than this request's), the buckets are lowered to them (never
        raised) and the deployment pauses for everyone until Retry-After, refilling
        meanwhile as the provider does. A 429 that does not say so (an overloaded
        provider: budget left, or no headers) costs only its own request a retry after
        Retry-After: pausing everyone for each one would add up to a standstill.
        Anything else counts towards opening the deployment's circuit.
        """
        self.flush()
        budget, cost = admitted.budget, admitted.cost
        if error.status_code == 429:
            requests, tokens = error.remaining
            inputs = error.remaining_input
            if requests is not None or tokens is not None or inputs is not None:
                _best_effort(self.limiter.clamp, budget, requests, tokens, None, inputs)
            if (requests is not None and requests < 1) or (tokens is not None
                                                           and tokens < cost) or (
                    inputs is not None and inputs < admitted.input_cost):
                _best_effort(self.limiter.pause, budget,
                             error.retry_after or DEFAULT_429_PAUSE_S)
            return True
        _best_effort(self.breaker.record_failure, admitted.deployment)
        return False

    def due_at(self) -> float | None:
        """When the settlements waiting are to be flushed (time.monotonic()); None: none."""
        if not self._count:
            return None
        return self._since if self._count >= FLUSH_SIZE else self._since + FLUSH_AFTER_S

    def due(self) -> bool:
        due_at = self.due_at()
        return due_at is not None and due_at <= time.monotonic()

    def flush(self) -> None:
        """One settle (and at most one clamp) per budget, one success per deployment."""
        if not self._count and not self._succeeded:
            return
        pending, self._pending = self._pending, {}
        succeeded, self._succeeded = self._succeeded, {}
        self._count = 0
        for entry in pending.values():
            _best_effort(self.limiter.settle, entry.budget, entry.settlements)
            if (seen := entry.remaining) is not None:
                _best_effort(self.limiter.clamp, entry.budget, seen.requests, seen.tokens,
                             seen.dating, seen.inputs)
        for deployment in succeeded.values():
            _best_effort(self.breaker.record_success, deployment)


def _split_settlement(admitted: Admitted, response: ProviderResponse | None) -> Settlement:
    """A split budget's call: max_tokens against the output tokens it produced (refunded
    as the limiter decides), the prompt's estimate against the input tokens the provider
    counted (cache reads are not counted against ITPM). A failed call gives back
    nothing: the provider may have counted it."""
    if response is None:
        return Settlement(admitted.slot, admitted.cost, 0.0, admitted.input_cost, 0.0,
                          answered=False)
    counted = response.prompt_tokens - response.cached_tokens
    return Settlement(admitted.slot, admitted.cost, float(admitted.cost
                                                          - response.completion_tokens),
                      admitted.input_cost, float(admitted.input_cost - counted))


def _best_effort(operation: Callable[..., Any], *args: Any) -> None:
    try:
        operation(*args)
    except ServiceUnavailable as exc:
        log.warning("feedback skipped: %s", exc)

"""The cluster-wide RPM/TPM limiter's vocabulary: budgets, admissions, settlements.

Each deployment has two continuously refilling buckets, requests and tokens,
with capacity = limit x burst_seconds / 60. Acquire is all-or-nothing over
both and answers "k admitted" plus the exact wait until the next would fit.
Queues keep floors: realtime may empty a bucket, standard and bulk stop at
their floor, so realtime always finds headroom while bulk still gets the
whole refill rate. Provider feedback (429, x-ratelimit-remaining-*) drains
or clamps the buckets for everyone. Whether the provider gives back the
unused part of max_tokens after a call differs between providers: `Refunds`
(quotaflow/deployments/limits.py, beside `Budget`, a deployment's limits as the buckets
see them) says, or has it learned from the provider's remaining-tokens headers.

A budget may carry caps (a tenant's, a job's RPM/TPM inside the deployment's: `Cap`,
in limits.py): each is one more pair of buckets, taken from in the same atomic step, so
a cap that refuses takes nothing from the deployment.

A "split" budget (a deployment with itpm and otpm, Anthropic's way) has a third
bucket: the tokens bucket then holds output tokens (max_tokens reserved, the
unused part refunded as `Refunds` says) and the input bucket the prompt's
estimated tokens, corrected both ways when the answer says how many were counted.

The limiters themselves are in quotaflow/budget/buckets.py.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from quotaflow.deployments.deployment import Deployment
from quotaflow.deployments.limits import Budget


@dataclass(frozen=True)
class Admission:
    """How many of the requests asked for were admitted, and the wait before the next fits.

    `slot` identifies the admission when it is settled; `tokens_in_flight` are
    admitted and unsettled, i.e. refunds that may yet shorten the wait where the
    deployment is `refunding` (the provider gives back unused reservations).
    `mark` is the budget's running total of admitted tokens before this admission:
    a header carried by one of its calls may not count anything admitted after it.
    `at` (the limiter's clock) and `refunded` (the budget's running total of refunds)
    date it too: see `Dating`.
    """

    admitted: int
    wait_s: float
    slot: int = 0
    tokens_in_flight: float = 0.0
    refunding: bool = False
    mark: float = 0.0
    at: float = 0.0
    refunded: float = 0.0
    # A cap of the budget (a tenant's, a job's) refused the next request: its wait is
    # the cap's, not the deployment's, which the others may still spend meanwhile.
    capped: bool = False

    def dating(self, cost: int) -> "Dating":
        """What dates the headers of the call admitted here at `cost`: it counted in the
        mark, the rest of its chunk not (the provider may have counted them or not)."""
        return Dating(self.mark + cost, self.tokens_in_flight, self.at, self.refunded)

    @property
    def refunds_due(self) -> bool:
        """Calls in flight will give tokens back: the wait may end sooner than said."""
        return self.refunding and self.tokens_in_flight > 0


@dataclass(slots=True)  # not frozen: one is made per call, and nothing changes it
class Dating:
    """Where a call's x-ratelimit-remaining headers stand in the budget's history, so the
    refund mode can be learned from bounds rather than from timing (docs/architecture.md,
    "Learning whether the provider gives back"): the budget's admitted-tokens total with
    the call counted, the tokens in flight at its admission (the provider may not have
    counted those when it wrote the header), and the limiter's clock and refunds total at
    its admission (the header cannot be older, nor miss refunds given back before it)."""

    mark: float
    flying: float
    at: float
    refunded: float


@dataclass(slots=True)
class Settlement:
    """One finished call: the slot it was admitted in, its admitted cost, and the tokens
    the provider did not use (its unused estimate; negative for a debt). Not frozen, as
    Dating: one is made per call."""

    slot: int
    cost: int
    refund: float
    # A split budget's input tokens: admitted, and not counted by the provider (< 0: more
    # were counted than estimated).
    input_cost: int = 0
    input_refund: float = 0.0
    # False: it failed without an answer (refused before the provider counted it, a
    # connection lost, never sent): the provider may not have counted it at all.
    answered: bool = True
    # False: it was never sent (its admission went stale in a stalled process, or its
    # lease passed to another worker): the provider cannot have counted it, so its
    # request and all its tokens go back, whether or not the provider gives refunds.
    sent: bool = True

    @property
    def state(self) -> str:
        """How bucket.lua's settle reads it: 1 answered, 0 failed unanswered, - never sent."""
        return "-" if not self.sent else "1" if self.answered else "0"


@dataclass(frozen=True)
class Levels:
    """A bucket pair's content right now."""

    requests: float
    tokens: float
    blocked_s: float
    refunding: bool = False
    inputs: float | None = None  # a split budget's input tokens
    # Per cap of the budget, in order: its requests and tokens left to spend.
    caps: tuple[tuple[float, float], ...] = ()

    def utilisation(self, budget: Budget) -> float:
        """The used share of the fuller-used bucket: max(rpm use, tpm use), 0..1."""
        used_r = 1 - self.requests / budget.request_capacity
        used_t = 1 - self.tokens / budget.token_capacity
        used_i = 0.0 if self.inputs is None else 1 - self.inputs / budget.input_capacity
        return min(1.0, max(0.0, used_r, used_t, used_i))


class Limiter(Protocol):
    """What the executor needs from a limiter; Redis and in-process versions agree."""

    def acquire(self, budget: Budget, costs: Sequence[int], floor: float,
                input_costs: Sequence[int] = ()) -> Admission:
        """Admit the longest prefix that fits; a split budget's requests also pay their
        input_costs (one per cost) from the input bucket."""

    def settle(self, budget: Budget, settlements: Sequence[Settlement]) -> None:
        """Close admitted calls: no longer in flight; refund their unused tokens."""

    def drain(self, budget: Budget, seconds: float) -> None: ...

    def pause(self, budget: Budget, seconds: float) -> None: ...

    def clamp(self, budget: Budget, requests: float | None, tokens: float | None,
              dating: Dating | None = None, inputs: float | None = None) -> None:
        """Lower the buckets to the provider's remaining figures. Dated by the call that
        carried them, the tokens figure may also prove or contradict refunds. `inputs`:
        a split budget's input tokens remaining."""

    def levels(self, budget: Budget) -> Levels: ...

def sleep_time(wait_s: float) -> float:
    """Sleep a hair past the exact wait so the next acquire lands after the refill."""
    return 0.0 if wait_s <= 0 else wait_s + 0.001 if math.isfinite(wait_s) else wait_s


def describe(deployment: Deployment, limiter: Limiter) -> dict[str, object]:
    """A deployment's limits and how full its buckets are now, for `quotaflow limits`."""
    budget = deployment.budget
    levels = limiter.levels(budget)
    return {
        "deployment": deployment.name,
        "provider": deployment.provider,
        "model": deployment.model,
        "rpm": deployment.rpm,
        "tpm": deployment.tpm,
        "itpm": deployment.itpm,
        "otpm": deployment.otpm,
        "burst_seconds": deployment.burst_seconds,
        "requests_available": round(levels.requests, 2),
        "tokens_available": round(levels.tokens, 1),
        "request_capacity": budget.request_capacity,
        "token_capacity": budget.token_capacity,
        **({"input_tokens_available": round(levels.inputs, 1),
            "input_capacity": budget.input_capacity} if levels.inputs is not None else {}),
        "blocked_for_s": round(levels.blocked_s, 3),
        "reconcile_usage": deployment.reconcile_usage,
        "refunds_unused_tokens": levels.refunding,
        "utilisation": round(levels.utilisation(budget), 4),
    }

"""A call admitted and never sent (its admission went stale while the process stalled, or
its lease passed to another worker) gives its budget back whole: the provider never saw
it. Kept, one such call idles a refunding deployment for as long as the provider takes to
refill a whole reservation (8 s at 3,000 TPM and max_tokens 400)."""

from typing import Any

import pytest

from quotaflow.budget.buckets import LocalLimiter
from quotaflow.deployments.limits import Budget, Refunds
from quotaflow.execution.admitted import Admitted
from quotaflow.execution.feedback import Feedback


def _admitted(limiter: LocalLimiter, budget: Budget, cost: int) -> Admitted:
    admitted = Admitted(item=None, deployment=None, provider=None, budget=budget,  # type: ignore[arg-type]
                        body={}, cost=cost)
    admitted.paid(limiter.acquire(budget, [cost], 0.0))
    return admitted


@pytest.mark.parametrize("refunds", [Refunds.ALWAYS, Refunds.NEVER],
                         ids=lambda refunds: refunds.name.lower())
def test_an_unsent_admission_gives_back_what_a_failed_call_keeps(refunds: Refunds) -> None:
    limiter = LocalLimiter()
    budget = Budget(f"unsent-{refunds.name}", 60, 3_000, 60, refunds=refunds)
    feedback = Feedback(limiter, breaker=None)  # type: ignore[arg-type]
    failed = _admitted(limiter, budget, 400)
    feedback.answered(failed, None)  # no answer: the provider may have counted it
    feedback.flush()
    assert limiter.levels(budget).tokens == pytest.approx(2_600, abs=2)
    stale = _admitted(limiter, budget, 400)
    feedback.unsent(stale)
    feedback.flush()
    levels: Any = limiter.levels(budget)
    assert levels.tokens == pytest.approx(2_600, abs=2)
    assert levels.requests == pytest.approx(59, abs=0.1)

"""Fair shares between tenants, a batch run's side (quotaflow/budget/fair_share.py).

Before claiming, a run of a tenant that others wait behind in the queue gives way
(claims nothing, comes back in YIELD_S); once claimed it counts as running, asks
before each acquire whether its tenant is ahead of the others on that budget
(execution/policies/tenant_share.py), is charged what the limiter admitted, and at a wait may
hand its slot back to a tenant waiting for a worker. Realtime runs get no such hook:
realtime has workers of its own.
"""

import logging
from collections.abc import Callable, Sequence

from quotaflow.budget.fair_share import FairShare
from quotaflow.deployments.limits import Budget
from quotaflow.errors import ServiceUnavailable
from quotaflow.execution.admitted import Admitted
from quotaflow.execution.batch import BatchRun
from quotaflow.execution.hooks import BatchHook
from quotaflow.execution.policies.tenant_share import TenantShare, fair_sleep
from quotaflow.execution.timing import YIELD_S
from quotaflow.results.leases import ClaimedItem

log = logging.getLogger(__name__)


class FairShareHook(BatchHook):
    """One run's place in its tenant's fair shares."""

    def __init__(self, fair: FairShare, tenant: str, weight: float) -> None:
        self.fair = fair
        self.tenant = tenant
        self.share = TenantShare(fair, tenant, weight)
        self._started = False

    def before_claim(self) -> float | None:
        """Another tenant's batches wait behind this one in the queue: let a worker reach
        them; this one claims nothing and comes back."""
        try:
            if self.fair.others_waiting(self.tenant) == 0:
                return None
            self.fair.queued(self.tenant)
        except ServiceUnavailable:
            return None
        return YIELD_S

    def claimed(self, run: BatchRun, items: list[ClaimedItem]) -> list[ClaimedItem]:
        _best_effort(self.fair.start, self.tenant)
        self._started = True
        return items

    def before_acquire(self, budget: Budget) -> float | None:
        share = self.share.before(budget)
        return None if share.allowed else fair_sleep(share)

    def chunk_admitted(self, entries: Sequence[Admitted], waited_s: float) -> None:
        self.share.after(entries[0].budget, len(entries), sum(a.cost for a in entries),
                         sum(a.input_cost for a in entries))

    def capped(self, budget: Budget) -> None:
        """Waiting for its cap, the tenant asks nothing of the budget: it steps out of the
        fair share, so the others are not held to its pace, and joins again at its next
        ask as any tenant coming back does (fair.lua)."""
        self.share.step_out(budget)

    def before_wait(self) -> bool:
        return self.share.may_yield(YIELD_S)

    def on_stop(self, run: BatchRun) -> None:
        """Leave the budgets at once (not after the TTL); unstarted items wait again."""
        self.share.close()
        if not self._started:
            return
        if run.retry_in is not None:
            _best_effort(self.fair.queued, self.tenant)
        _best_effort(self.fair.stop, self.tenant)


def _best_effort(operation: Callable[[str], None], tenant: str) -> None:
    """Fair shares are bookkeeping: a Redis that is down must not fail a batch."""
    try:
        operation(tenant)
    except ServiceUnavailable:
        log.warning("fair shares skipped: the limiter's Redis is unreachable")

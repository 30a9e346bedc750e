"""A batch run's side of the fair shares between tenants (quotaflow/budget/fair_share.py).

The admission loop asks `before` ahead of each acquire and reports what the limiter
admitted to `after`; the charge rides on the next ask (one round trip, not two). While
the run's tenant is the only one asking for a budget, it asks again only every
ALONE_S: a lone tenant needs no permission, only to stay visible to a newcomer. When
the run ends it charges what is left and leaves, so a tenant whose work is done stops
holding the others back at once rather than after the TTL.
"""

import contextlib
import time
from dataclasses import dataclass, field

from quotaflow.budget.fair_share import FairShare, Share, budget_seconds
from quotaflow.deployments.limits import Budget
from quotaflow.errors import ServiceUnavailable

ALONE_S = 0.25
# The longest one sleep while over the share: the others' progress is not watched.
MAX_FAIR_SLEEP_S = 0.25


@dataclass
class TenantShare:
    fair: FairShare
    tenant: str
    weight: float = 1.0
    # budget name -> budget-seconds admitted since the last ask
    _charge: dict[str, float] = field(default_factory=dict)
    _joined: dict[str, Budget] = field(default_factory=dict)
    # budget name -> monotonic time until which this tenant was alone on it
    _alone_until: dict[str, float] = field(default_factory=dict)
    others_waiting: bool = False

    def before(self, budget: Budget) -> Share:
        """May the run ask the limiter for `budget` now? A fairness store that is down
        lets it (the limiter keeps the budget; only the split is lost)."""
        if time.monotonic() < self._alone_until.get(budget.name, 0.0):
            return Share(True)
        join = budget.name not in self._joined
        try:
            share = self.fair.ask(budget, self.tenant, self.weight,
                                  self._charge.pop(budget.name, 0.0), join)
        except ServiceUnavailable:
            return Share(True)
        self._joined[budget.name] = budget
        self.others_waiting = share.others_waiting > 0
        if share.active == 1 and not self.others_waiting:
            self._alone_until[budget.name] = time.monotonic() + ALONE_S
        return share

    def after(self, budget: Budget, requests: int, tokens: int, input_tokens: int = 0) -> None:
        if requests:
            self._charge[budget.name] = self._charge.get(budget.name, 0.0) + budget_seconds(
                budget, requests, tokens, input_tokens)

    def step_out(self, budget: Budget) -> None:
        """Leave `budget`'s fair share for now (charged what was admitted); the next
        `before` joins it again."""
        if (joined := self._joined.pop(budget.name, None)) is None:
            return
        self._alone_until.pop(budget.name, None)
        with contextlib.suppress(ServiceUnavailable):  # the count lapses after the TTL
            self.fair.leave(joined, self.tenant, self.weight, self._charge.pop(budget.name, 0.0))

    def may_yield(self, seconds: float) -> bool:
        """Hand the run's slot back now, for a tenant waiting for a worker?"""
        if not self.others_waiting:
            return False
        try:
            return self.fair.take_yield(self.tenant, seconds)
        except ServiceUnavailable:
            return False

    def close(self) -> None:
        """Charge what was admitted since the last ask and stop asking: the run is over."""
        try:
            for name, budget in self._joined.items():
                self.fair.leave(budget, self.tenant, self.weight, self._charge.pop(name, 0.0))
        except ServiceUnavailable:
            pass  # the runs' count lapses by itself after the TTL
        self._joined.clear()


def fair_sleep(share: Share) -> float:
    return min(max(share.wait_s, 0.01), MAX_FAIR_SLEEP_S)

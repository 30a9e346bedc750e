"""An item on its way to one deployment, and what its admission there paid."""

import time
from dataclasses import dataclass
from typing import Any

from quotaflow.budget.limiter import Admission, Dating
from quotaflow.deployments.deployment import Deployment
from quotaflow.deployments.limits import Budget
from quotaflow.providers import Provider
from quotaflow.results.leases import ClaimedItem


@dataclass
class Admitted:
    """An item prepared for one deployment: the provider and request as sent there, and
    its admission cost (a split budget's output tokens, and `input_cost` its input
    tokens). Once paid for: the slot of the admission (to settle it), and
    to date the provider's headers on its answer, when it was admitted and the
    budget's admitted-tokens total with it counted (the rest of its chunk, admitted at
    the same instant, left out: the provider may have counted them or not)."""

    item: ClaimedItem
    deployment: Deployment
    provider: Provider
    budget: Budget
    body: dict[str, Any]
    cost: int
    slot: int = 0
    input_cost: int = 0
    dating: Dating | None = None
    admitted_at: float = 0.0

    def paid(self, admission: Admission) -> None:
        self.slot, self.dating = admission.slot, admission.dating(self.cost)
        self.admitted_at = time.monotonic()

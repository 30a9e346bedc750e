"""Caps inside a deployment's budget: a tenant's or a job's RPM/TPM, as buckets.

A cap (`Cap`, quotaflow/deployments/limits.py) is a pair of buckets per scope and
deployment budget, refilled, spent and refunded the way the deployment's own are, and
taken from in the same atomic step: bucket.lua does it for the Redis limiter (the cap's
hash sits in the deployment's Redis Cluster slot), `LocalCaps` here for the in-process
one. A budget without caps costs nothing more: no extra key, no extra arithmetic.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from quotaflow.constants import REDIS_PREFIX
from quotaflow.deployments.limits import Budget, Cap
from quotaflow.errors import InvalidParameter

EPS = 1e-9
# The largest cap accepted: beyond any provider's limits, and within a BIGINT.
MAX_CAP = 10**12


def cap_key(budget_name: str, scope: str) -> str:
    """A cap's hash, in the same hash slot as its deployment's ("{...:rl:<name>}")."""
    return f"{{{REDIS_PREFIX}:rl:{budget_name}}}:cap:{scope}"


def caps_of(tenant: str, tenant_rpm: int | None, tenant_tpm: int | None, job_id: str,
            job_rpm: int | None, job_tpm: int | None) -> tuple[Cap, ...]:
    """The caps a job's requests are admitted under: its tenant's and its own, if set."""
    caps = []
    if tenant_rpm or tenant_tpm:
        caps.append(Cap(f"tenant:{tenant}", float(tenant_rpm or 0), float(tenant_tpm or 0)))
    if job_rpm or job_tpm:
        caps.append(Cap(f"job:{job_id}", float(job_rpm or 0), float(job_tpm or 0)))
    return tuple(caps)


def check_cap(param: str, value: int | None) -> int | None:
    """A cap as given (max_rpm, --tpm, ...): a whole number of at least 1, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CAP:
        raise InvalidParameter(param, f"{param} must be a whole number from 1 to {MAX_CAP} "
                                      f"(per minute), got {value!r}")
    return value


@dataclass
class CapState:
    """One cap's buckets: requests, tokens with refunds given back (t) and without (tn)."""

    cap: Cap
    r: float
    t: float
    tn: float
    ts: float
    capacity_r: float
    capacity_t: float

    def wait(self, cost: float, refunding: bool) -> float:
        """Until this cap takes one more request of `cost` tokens; 0: it does now."""
        level = self.t if refunding else self.tn
        wait = 0.0
        if self.capacity_r and self.r - 1 < -EPS:
            wait = (1 - self.r) / (self.cap.rpm / 60)
        if self.capacity_t and level - cost < -EPS:
            wait = max(wait, (cost - level) / (self.cap.tpm / 60))
        return wait

    def take(self, cost: float) -> None:
        if self.capacity_r:
            self.r -= 1
        if self.capacity_t:
            self.t -= cost
            self.tn = max(min(self.tn, 0.0), self.tn - cost)

    def refund(self, refund: float, both: bool) -> None:
        """A refund to t (to tn as well where `both`: never sent, or input corrected);
        a debt (< 0) to both."""
        if refund < 0:
            self.t += refund
            self.tn += refund
            return
        self.t = max(self.t, min(self.t + refund, self.capacity_t))
        if both:
            self.tn = max(self.tn, min(self.tn + refund, self.capacity_t))


class LocalCaps:
    """The in-process caps of LocalLimiter, refilled on its clock."""

    def __init__(self) -> None:
        self._states: dict[tuple[str, str], CapState] = {}

    def refilled(self, budget: Budget, now: float) -> Sequence[CapState]:
        states = []
        for cap in budget.caps:
            capacity_r, capacity_t = cap.capacities(budget.burst_seconds)
            state = self._states.get((budget.name, cap.scope))
            if state is None:
                state = self._states[budget.name, cap.scope] = CapState(
                    cap, capacity_r, capacity_t, capacity_t, now, capacity_r, capacity_t)
            state.cap, state.capacity_r, state.capacity_t = cap, capacity_r, capacity_t
            elapsed = max(0.0, now - state.ts)
            state.r = min(capacity_r, state.r + elapsed * cap.rpm / 60)
            state.t = min(capacity_t, state.t + elapsed * cap.tpm / 60)
            state.tn = min(capacity_t, state.tn + elapsed * cap.tpm / 60)
            state.ts = now
            states.append(state)
        return states


def held_for(states: Sequence[CapState], cost: float, refunding: bool) -> float:
    """The longest any of the caps holds a request of `cost` tokens back; 0: none does."""
    return max((state.wait(cost, refunding) for state in states), default=0.0)

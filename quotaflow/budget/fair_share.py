"""Fair shares of a deployment's budget between tenants, cluster-wide.

The limiter (ratelimit.py) keeps a deployment under its RPM/TPM; it does not care whose
requests those are, so whoever submitted first would take the whole budget. Here each
tenant of a budget has a virtual time in Redis (lua/fair.lua): the budget-seconds it was
admitted (the larger of its requests' and its tokens' share of the refill), divided by
its weight. A tenant may ask the limiter while its virtual time is within a quantum of the
lowest of the other tenants asking for that budget now (a weighted fair share in the way
of start-time fair queueing); alone it may always ask, and a tenant that stops asking
drops out after a short TTL, so an unused share flows to whoever has work.

Budget is half of it: a tenant whose batches are all still in the queue, behind
thousands of another tenant's, asks nothing. Dispatch (and a batch handed back) marks
its tenant as having a batch queued; a marked tenant with no batch running waits for a
worker. While one waits, batches of the other tenants taken from the queue go back to
it unclaimed, and one running batch at a time hands its slot back at its next wait, so
the freed slot walks the queue to the waiting tenant's message within seconds. Only
tenants waiting since earlier are given way to, so the longest waiter always runs.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from quotaflow.constants import REDIS_PREFIX
from quotaflow.deployments.limits import Budget
from quotaflow.errors import ServiceUnavailable
from quotaflow.redis_clients import UNREACHABLE, connect
from quotaflow.redis_scripts import load_script

SCRIPT = Path(__file__).with_name("lua") / "fair.lua"
# A tenant that has not asked for a budget this long no longer has demand for it.
ACTIVE_TTL_S = 2.0
# How far (budget-seconds per unit of weight) a tenant may run ahead of the others.
QUANTUM_S = 0.1
# A dispatched tenant counts as waiting for a worker this long unless a batch is reached.
QUEUED_TTL_S = 15.0
SLOTS_KEY = f"{{{REDIS_PREFIX}:fair}}:slots"


def fair_key(budget_name: str) -> str:
    return f"{{{REDIS_PREFIX}:fair}}:d:{budget_name}"


def budget_seconds(budget: Budget, requests: int, tokens: int, input_tokens: int = 0) -> float:
    """What an admission took of the deployment: seconds of its refill, the larger of
    the requests' and the tokens' share (the limit that binds is the one spent)."""
    spent = max(requests / budget.request_rate, tokens / budget.token_rate)
    if budget.split:
        spent = max(spent, input_tokens / budget.input_rate)
    return spent


@dataclass(frozen=True)
class Share:
    """May the tenant ask the limiter now; if not, about how long until it may."""

    allowed: bool
    wait_s: float = 0.0
    active: int = 1  # tenants asking for this budget now, this one included
    others_waiting: int = 0  # tenants waiting for a worker that this one gives way to


class FairShare(Protocol):
    def ask(self, budget: Budget, tenant: str, weight: float, charge: float,
            join: bool = False) -> Share:
        """Charge the tenant's last admissions (budget-seconds) and say whether it may ask
        again; `join`: a batch run's first ask for this budget."""

    def leave(self, budget: Budget, tenant: str, weight: float = 1.0,
              charge: float = 0.0) -> None:
        """A batch run stops asking for this budget, charged for its last admissions."""

    def queued(self, tenant: str) -> None:
        """A batch of the tenant went to a queue: dispatched, or handed back."""

    def start(self, tenant: str) -> None:
        """A batch of the tenant reached a worker."""

    def stop(self, tenant: str) -> None: ...

    def others_waiting(self, tenant: str) -> int:
        """Tenants waiting for a worker that this one gives way to."""

    def take_yield(self, tenant: str, seconds: float) -> bool:
        """Should a running batch of `tenant` hand its slot back now? One batch per
        `seconds` in the cluster is enough: the freed slot walks the queue."""


class NoFairShare:
    """One process, one tenant at a time (`quotaflow run`), or fairness switched off."""

    def ask(self, budget: Budget, tenant: str, weight: float, charge: float,
            join: bool = False) -> Share:
        return Share(True)

    def leave(self, budget: Budget, tenant: str, weight: float = 1.0,
              charge: float = 0.0) -> None:
        return None

    def queued(self, tenant: str) -> None:
        return None

    def start(self, tenant: str) -> None:
        return None

    def stop(self, tenant: str) -> None:
        return None

    def others_waiting(self, tenant: str) -> int:
        return 0

    def take_yield(self, tenant: str, seconds: float) -> bool:
        return False


class RedisFairShare:
    """lua/fair.lua: one call per operation on the server's clock."""

    def __init__(self, url: str, active_ttl_s: float = ACTIVE_TTL_S,
                 quantum_s: float = QUANTUM_S) -> None:
        self._redis = connect(url, socket_timeout=5, socket_connect_timeout=5)
        self._script = load_script(self._redis, SCRIPT.read_text())
        self._ttl = repr(float(active_ttl_s))
        self._quantum = repr(float(quantum_s))

    def _call(self, budget: str, *args: str) -> str:
        try:
            reply = self._script(keys=[fair_key(budget), SLOTS_KEY], args=list(args))
        except UNREACHABLE as exc:
            raise ServiceUnavailable(
                f"the limiter's Redis is unreachable ({exc.__class__.__name__}); check "
                "QUOTAFLOW_REDIS_URL and that Redis is running") from exc
        return reply.decode() if isinstance(reply, bytes) else str(reply)

    def ask(self, budget: Budget, tenant: str, weight: float, charge: float,
            join: bool = False) -> Share:
        allowed, wait, active, waiting = self._call(
            budget.name, "ask", tenant, repr(float(weight)), repr(float(charge)), self._ttl,
            self._quantum, "1" if join else "0").split()
        return Share(allowed == "1", float(wait), int(active), int(waiting))

    def leave(self, budget: Budget, tenant: str, weight: float = 1.0,
              charge: float = 0.0) -> None:
        self._call(budget.name, "leave", tenant, repr(float(weight)), repr(float(charge)))

    def queued(self, tenant: str) -> None:
        self._call("", "queued", tenant, repr(QUEUED_TTL_S))

    def start(self, tenant: str) -> None:
        self._call("", "start", tenant)

    def stop(self, tenant: str) -> None:
        self._call("", "stop", tenant)

    def others_waiting(self, tenant: str) -> int:
        return int(self._call("", "waiting", tenant))

    def take_yield(self, tenant: str, seconds: float) -> bool:
        return self._call("", "yield", tenant, repr(float(seconds))) == "1"


def make_fair_share(url: str | None, enabled: bool) -> FairShare:
    return RedisFairShare(url) if url and enabled else NoFairShare()

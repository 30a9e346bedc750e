"""Which deployment of a model's group takes the next requests.

The deployment with the lowest utilisation, max(RPM used, TPM used) as the
limiter reads it right now, divided by its weight; ties are broken at random
in proportion to the weights. Since utilisation is a share of each
deployment's own budget, evening it out spreads work in proportion to the
budgets (and a weight of 2 lets a deployment run twice as full as its
peers). Deployments cooling down after a 429 and those whose circuit is open
are skipped; a half-open circuit gets its one probe before anything else
goes elsewhere, so a recovered deployment is noticed at once. The route's
fallback deployments are used, in order, only when no deployment of the
group is available.
"""

import math
import random
from collections.abc import Collection
from dataclasses import dataclass

from quotaflow.budget.circuit import Circuit, CircuitBreaker, CircuitState
from quotaflow.budget.limiter import Limiter
from quotaflow.deployments.catalog import Deployments, Route
from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import ServiceUnavailable

# Utilisations this close count as equal, so the weights decide among them.
TIE = 1e-3


@dataclass(frozen=True)
class Choice:
    """A deployment to send to, or none and how long until one may be available.

    `probe`: the deployment's circuit is half-open; send it one request only.
    """

    deployment: Deployment | None
    probe: bool = False
    wait_s: float = 0.0


class Router:
    """Picks deployments for a route from the limiter's levels and the circuit breakers."""

    def __init__(self, deployments: Deployments, limiter: Limiter, breaker: CircuitBreaker,
                 rng: random.Random | None = None) -> None:
        self.deployments = deployments
        self.limiter = limiter
        self.breaker = breaker
        self._rng = rng or random.Random()

    def choose(self, route: Route, exclude: Collection[str] = ()) -> Choice:
        """The best deployment of the group, else of the fallbacks in order, else a wait.

        `exclude` names deployments not to use now (busy, or sharing the quota of
        one that just answered 429).
        """
        waits: list[float] = []
        group = [n for n in route.deployments if n not in exclude]
        if len(group) == 1 and not route.fallback:
            return self._only(self.deployments.deployments[group[0]])
        if group:
            choice = self._best_of(group)
            if choice.deployment is not None:
                return choice
            waits.append(choice.wait_s)
        for name in route.fallback:
            if name in exclude:
                continue
            choice = self._best_of([name])
            if choice.deployment is not None:
                return choice
            waits.append(choice.wait_s)
        return Choice(None, wait_s=min(waits, default=math.inf))

    def siblings(self, deployment: Deployment) -> frozenset[str]:
        """The other deployments spending the same upstream quota as `deployment`."""
        if deployment.quota is None:
            return frozenset()
        return frozenset(d.name for d in self.deployments.deployments.values()
                         if d.quota == deployment.quota and d.name != deployment.name)

    def _only(self, deployment: Deployment) -> Choice:
        """A lone deployment needs no comparison: only its circuit can keep work from it
        (a 429 block is the limiter's to enforce, which acquire reports as a wait)."""
        circuit = self._circuit(deployment)
        if circuit.state == CircuitState.PROBE_FREE:
            if self._claim_probe(deployment):
                return Choice(deployment, probe=True)
            circuit = self._circuit(deployment)
        if not circuit.usable:
            return Choice(None, wait_s=circuit.wait_s)
        return Choice(deployment)

    def _best_of(self, names: list[str]) -> Choice:
        scored: list[tuple[float, Deployment]] = []
        half_open: list[Deployment] = []
        waits: list[float] = []
        for name in names:
            deployment = self.deployments.deployments[name]
            circuit = self._circuit(deployment)
            if not circuit.usable:
                waits.append(circuit.wait_s)
                continue
            budget = deployment.budget
            levels = self.limiter.levels(budget)
            if levels.blocked_s > 0:  # cooling down after a 429
                waits.append(levels.blocked_s)
            elif circuit.state == CircuitState.PROBE_FREE:
                half_open.append(deployment)
            else:
                scored.append((levels.utilisation(budget) / deployment.weight, deployment))
        for deployment in half_open:
            if self._claim_probe(deployment):
                return Choice(deployment, probe=True)
        if not scored:
            return Choice(None, wait_s=min(waits, default=math.inf))
        lowest = min(score for score, _ in scored)
        tied = [deployment for score, deployment in scored if score <= lowest + TIE]
        picked = self._rng.choices(tied, weights=[d.weight for d in tied])[0]
        return Choice(picked)

    def _circuit(self, deployment: Deployment) -> Circuit:
        """A breaker that cannot be read counts as closed: Redis being down must not
        stop traffic that the limiter (which says so itself) would let through."""
        try:
            return self.breaker.state(deployment)
        except ServiceUnavailable:
            return Circuit(CircuitState.CLOSED)

    def _claim_probe(self, deployment: Deployment) -> bool:
        try:
            return self.breaker.try_probe(deployment)
        except ServiceUnavailable:
            return False

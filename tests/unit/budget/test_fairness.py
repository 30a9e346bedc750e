"""A batch run's side of fair shares (quotaflow/execution/policies/tenant_share.py), against a fake
store: what is charged and when, the lone tenant's fewer asks, and a store that is down
letting work through (the limiter still keeps the budget)."""

from dataclasses import dataclass, field

import pytest

from quotaflow.budget.fair_share import NoFairShare, Share, budget_seconds
from quotaflow.deployments.limits import Budget
from quotaflow.errors import ServiceUnavailable
from quotaflow.execution.policies.tenant_share import TenantShare, fair_sleep

BUDGET = Budget("unit", rpm=600, tpm=6000)  # 10 requests or 100 tokens a second


@dataclass
class FakeStore(NoFairShare):
    replies: list[Share] = field(default_factory=list)
    asks: list[tuple[float, bool]] = field(default_factory=list)
    left: list[float] = field(default_factory=list)
    down: bool = False

    def ask(self, budget: Budget, tenant: str, weight: float, charge: float,
            join: bool = False) -> Share:
        if self.down:
            raise ServiceUnavailable("down")
        self.asks.append((charge, join))
        return self.replies.pop(0) if self.replies else Share(True, active=2)

    def leave(self, budget: Budget, tenant: str, weight: float = 1.0,
              charge: float = 0.0) -> None:
        self.left.append(charge)


def test_the_binding_limit_is_what_an_admission_costs() -> None:
    assert budget_seconds(BUDGET, 5, 10) == pytest.approx(0.5)  # requests bind
    assert budget_seconds(BUDGET, 1, 300) == pytest.approx(3.0)  # tokens bind


def test_charges_ride_on_the_next_ask_and_the_last_on_the_leave() -> None:
    store = FakeStore()
    run = TenantShare(store, "t")
    run.before(BUDGET)
    run.after(BUDGET, 5, 10)
    run.before(BUDGET)
    run.after(BUDGET, 1, 300)
    run.close()
    assert store.asks == [(0.0, True), (pytest.approx(0.5), False)]
    assert store.left == [pytest.approx(3.0)]


def test_a_lone_tenant_asks_again_only_after_a_while() -> None:
    store = FakeStore(replies=[Share(True, active=1)])
    run = TenantShare(store, "t")
    assert all(run.before(BUDGET).allowed for _ in range(5))
    assert len(store.asks) == 1


def test_a_store_that_is_down_lets_work_through() -> None:
    run = TenantShare(FakeStore(down=True), "t")
    assert run.before(BUDGET).allowed
    run.close()


def test_over_the_share_sleeps_briefly() -> None:
    assert fair_sleep(Share(False, wait_s=10.0)) == 0.25
    assert fair_sleep(Share(False, wait_s=0.0)) == 0.01

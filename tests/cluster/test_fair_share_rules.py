"""lua/fair.lua's rules on a real Redis (quotaflow/budget/fair_share.py): weighted shares of a
budget among the tenants asking for it now, work-conserving, and who gives way to whom
while a tenant waits for a worker."""

import time

import pytest

from quotaflow.budget.fair_share import QUANTUM_S, RedisFairShare, budget_seconds
from quotaflow.deployments.limits import Budget
from quotaflow.execution.policies.tenant_share import TenantShare

BUDGET = Budget("fair-rules", rpm=1200, tpm=60000)


@pytest.fixture
def fair(redis_url: str) -> RedisFairShare:
    return RedisFairShare(redis_url)


def test_a_tenant_alone_is_always_allowed_however_much_it_took(fair: RedisFairShare) -> None:
    assert fair.ask(BUDGET, "a", 1, 0.0, join=True).allowed
    share = fair.ask(BUDGET, "a", 1, 100.0)
    assert share.allowed and share.active == 1


def test_equal_tenants_take_turns_within_a_quantum(fair: RedisFairShare) -> None:
    fair.ask(BUDGET, "a", 1, 0.0, join=True)
    fair.ask(BUDGET, "a", 1, 50.0)  # alone for a while: no debt when b comes
    assert fair.ask(BUDGET, "b", 1, 0.0, join=True).allowed
    ahead = fair.ask(BUDGET, "a", 1, 2 * QUANTUM_S)
    assert not ahead.allowed and ahead.active == 2
    assert ahead.wait_s == pytest.approx(QUANTUM_S, rel=1e-6)  # b, alone, catches up
    assert fair.ask(BUDGET, "b", 1, 2 * QUANTUM_S).allowed
    assert fair.ask(BUDGET, "a", 1, 0.0).allowed


def test_weights_divide_the_charge(fair: RedisFairShare) -> None:
    fair.ask(BUDGET, "heavy", 3, 0.0, join=True)
    fair.ask(BUDGET, "light", 1, 0.0, join=True)
    # Three times the budget-seconds costs the heavy tenant as much virtual time.
    assert fair.ask(BUDGET, "heavy", 3, 3 * QUANTUM_S).allowed
    assert not fair.ask(BUDGET, "heavy", 3, 0.01).allowed
    assert fair.ask(BUDGET, "light", 1, QUANTUM_S).allowed
    assert fair.ask(BUDGET, "heavy", 3, 0.0).allowed


def test_a_tenant_that_leaves_holds_no_one_back(fair: RedisFairShare) -> None:
    fair.ask(BUDGET, "a", 1, 0.0, join=True)
    fair.ask(BUDGET, "b", 1, 0.0, join=True)
    assert not fair.ask(BUDGET, "a", 1, 1.0).allowed
    fair.leave(BUDGET, "b")
    share = fair.ask(BUDGET, "a", 1, 1.0)
    assert share.allowed and share.active == 1


def test_the_longest_waiting_tenant_is_given_way_to(fair: RedisFairShare) -> None:
    fair.start("a")
    fair.queued("b")
    time.sleep(0.01)
    fair.queued("c")
    assert fair.others_waiting("a") == 2  # running: gives way to both
    assert fair.others_waiting("b") == 0  # waiting longest: never gives way
    assert fair.others_waiting("c") == 1
    assert fair.take_yield("a", 5.0) and not fair.take_yield("a", 5.0)  # one slot at a time
    fair.start("b")
    assert fair.others_waiting("a") == 1 and fair.others_waiting("b") == 1
    fair.start("c")
    assert fair.others_waiting("a") == 0
    fair.stop("a")
    fair.queued("a")  # a batch handed back, none running: a waits now
    assert fair.others_waiting("b") == 1 and fair.others_waiting("a") == 0


def test_a_run_charges_what_it_was_admitted_and_leaves_at_its_end(fair: RedisFairShare) -> None:
    run = TenantShare(fair, "a")
    assert run.before(BUDGET).allowed
    run.after(BUDGET, 10, 100)
    fair.ask(BUDGET, "b", 1, 0.0, join=True)
    run._alone_until.clear()
    share = run.before(BUDGET)  # 10 requests at 20/s: 0.5 budget-seconds ahead of b
    assert not share.allowed
    assert budget_seconds(BUDGET, 10, 100) == pytest.approx(0.5)
    run.close()
    assert fair.ask(BUDGET, "b", 1, 5.0).active == 1


def test_a_short_absence_keeps_what_the_tenant_was_owed_a_long_one_does_not(
        fair: RedisFairShare) -> None:
    fair.ask(BUDGET, "a", 1, 0.0, join=True)
    fair.ask(BUDGET, "b", 1, 0.0, join=True)
    fair.ask(BUDGET, "a", 1, 0.5)  # a is 0.5 s of budget ahead
    fair.leave(BUDGET, "b")  # b's batch handed back for a moment
    assert fair.ask(BUDGET, "b", 1, 0.0, join=True).allowed
    assert not fair.ask(BUDGET, "a", 1, 0.0).allowed  # b still has its 0.5 s to come
    fair.leave(BUDGET, "a")  # and a paused between batches keeps its lead (its debt)
    assert not fair.ask(BUDGET, "a", 1, 0.0, join=True).allowed

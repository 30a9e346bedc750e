"""Routing: the least-used deployment of a group, weights, cooldowns, circuits, fallbacks."""

import random
from collections import Counter

import pytest

from quotaflow.budget.buckets import LocalLimiter
from quotaflow.budget.circuit import LocalCircuitBreaker
from quotaflow.budget.routing import Router
from quotaflow.deployments.catalog import Deployments, Route, load_deployments
from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import ConfigError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def deployment(name: str, rpm: int = 600, weight: float = 1.0,
               quota: str | None = None) -> Deployment:
    return Deployment(name=name, provider="mock", model="m", rpm=rpm, tpm=rpm * 1000,
                      weight=weight, quota=quota, circuit_failures=1, circuit_cooldown_s=10,
                      timeout_s=5)


def router(*members: Deployment, fallback: tuple[Deployment, ...] = (),
           clock: Clock | None = None, seed: int = 7) -> Router:
    clock = clock or Clock()
    everything = {d.name: d for d in (*members, *fallback)}
    route = Route(deployments=[d.name for d in members], fallback=[d.name for d in fallback])
    table = Deployments(deployments=everything, routes={"*": route})
    return Router(table, LocalLimiter(clock), LocalCircuitBreaker(clock), random.Random(seed))


def route_of(chooser: Router) -> Route:
    return chooser.deployments.routes["*"]


def spend(chooser: Router, target: Deployment, requests: int) -> None:
    admission = chooser.limiter.acquire(target.budget, [1] * requests, 0.0)
    assert admission.admitted == requests


def test_the_least_used_deployment_gets_the_work() -> None:
    a, b, c = deployment("a"), deployment("b"), deployment("c")
    chooser = router(a, b, c)
    spend(chooser, a, 300)  # half of a's 600 requests
    spend(chooser, b, 60)
    spend(chooser, c, 120)
    assert chooser.choose(route_of(chooser)).deployment.name == "b"


def test_utilisation_is_relative_to_each_budget() -> None:
    small, large = deployment("small", rpm=100), deployment("large", rpm=1000)
    chooser = router(small, large)
    spend(chooser, small, 20)  # 20% used
    spend(chooser, large, 100)  # 10% used: more requests, yet less used
    assert chooser.choose(route_of(chooser)).deployment.name == "large"


def test_ties_are_broken_at_random_in_proportion_to_weights() -> None:
    chooser = router(deployment("a"), deployment("b"), deployment("heavy", weight=2))
    picks = Counter(chooser.choose(route_of(chooser)).deployment.name for _ in range(4000))
    assert set(picks) == {"a", "b", "heavy"}
    assert picks["heavy"] / 2000 == pytest.approx(1, rel=0.1)
    assert picks["a"] / 1000 == pytest.approx(1, rel=0.1)


def test_a_weight_lets_a_deployment_run_fuller_than_its_peers() -> None:
    light, heavy = deployment("light"), deployment("heavy", weight=2)
    chooser = router(light, heavy)
    spend(chooser, heavy, 300)  # 50% used, weight 2: counts as 25%
    spend(chooser, light, 180)  # 30% used
    assert chooser.choose(route_of(chooser)).deployment.name == "heavy"


def test_a_deployment_cooling_down_after_a_429_is_skipped() -> None:
    a, b = deployment("a"), deployment("b")
    chooser = router(a, b)
    spend(chooser, b, 300)
    chooser.limiter.drain(a.budget, 5.0)
    assert chooser.choose(route_of(chooser)).deployment.name == "b"


def test_an_open_circuit_is_skipped_then_probed_once_after_the_cooldown() -> None:
    clock = Clock()
    broken, healthy = deployment("broken"), deployment("healthy")
    chooser = router(broken, healthy, clock=clock)
    spend(chooser, healthy, 300)  # the broken one is the least used...
    chooser.breaker.record_failure(broken)  # ...but its circuit is open
    for _ in range(20):
        assert chooser.choose(route_of(chooser)).deployment.name == "healthy"
    clock.now += 10.5
    probe = chooser.choose(route_of(chooser))
    assert (probe.deployment.name, probe.probe) == ("broken", True)
    # While the probe is out, nothing else goes to the broken deployment
    assert chooser.choose(route_of(chooser)).deployment.name == "healthy"
    chooser.breaker.record_success(broken)
    after = chooser.choose(route_of(chooser))
    assert (after.deployment.name, after.probe) == ("broken", False)


def test_fallbacks_are_used_in_order_only_when_the_group_is_unavailable() -> None:
    first, second = deployment("first"), deployment("second")
    cheap, cheaper = deployment("cheap"), deployment("cheaper")
    chooser = router(first, second, fallback=(cheap, cheaper))
    spend(chooser, first, 590)
    spend(chooser, second, 590)  # nearly empty, yet available: no fallback
    assert chooser.choose(route_of(chooser)).deployment.name in {"first", "second"}
    chooser.breaker.record_failure(first)
    chooser.limiter.drain(second.budget, 3.0)
    assert chooser.choose(route_of(chooser)).deployment.name == "cheap"
    chooser.breaker.record_failure(cheap)
    assert chooser.choose(route_of(chooser)).deployment.name == "cheaper"


def test_nothing_available_says_how_long_until_something_may_be() -> None:
    a, b = deployment("a"), deployment("b")
    chooser = router(a, b)
    chooser.limiter.drain(a.budget, 2.0)
    chooser.breaker.record_failure(b)  # open for 10 s
    choice = chooser.choose(route_of(chooser))
    assert choice.deployment is None
    assert choice.wait_s == pytest.approx(2.0)


def test_deployments_sharing_a_quota_share_one_budget_and_are_siblings() -> None:
    east, west = deployment("east", quota="org-1"), deployment("west", quota="org-1")
    other = deployment("other")
    chooser = router(east, west, other)
    assert east.budget.name == west.budget.name != other.budget.name
    assert chooser.siblings(east) == {"west"}
    assert chooser.siblings(other) == frozenset()
    # A 429 on east drains the shared quota: west cools down too, the retry goes elsewhere
    chooser.limiter.drain(east.budget, 5.0)
    picks = {chooser.choose(route_of(chooser), exclude=chooser.siblings(east)).deployment.name
             for _ in range(20)}
    assert picks == {"other"}


def test_saturated_deployments_take_work_in_proportion_to_their_budgets() -> None:
    # Given three deployments of 600, 1200 and 1800 RPM, kept busy for three minutes
    clock = Clock()
    members = (deployment("a", rpm=600), deployment("b", rpm=1200), deployment("c", rpm=1800))
    chooser = router(*members, clock=clock)
    sent: Counter[str] = Counter()
    for _ in range(3 * 60 * 100):  # every 10 ms, route and try to send five requests
        clock.now += 0.01
        for _ in range(5):
            choice = chooser.choose(route_of(chooser))
            if chooser.limiter.acquire(choice.deployment.budget, [1], 0.0).admitted:
                sent[choice.deployment.name] += 1
    total = sum(sent.values())
    for member in members:
        assert sent[member.name] / total == pytest.approx(member.rpm / 3600, rel=0.05)


def test_routes_are_read_in_every_form(tmp_path) -> None:
    path = tmp_path / "d.toml"
    path.write_text(
        '[deployments.a]\nprovider = "mock"\nmodel = "m"\nrpm = 10\ntpm = 1000\n'
        '[deployments.b]\nprovider = "mock"\nmodel = "m"\nrpm = 10\ntpm = 1000\n'
        '[deployments.c]\nprovider = "mock"\nmodel = "cheap"\nrpm = 10\ntpm = 1000\n'
        '[routes]\n"one" = "a"\n"group" = ["a", "b"]\n'
        '"with-fallback" = { deployments = ["a", "b"], fallback = ["c"] }\n')
    table = load_deployments(path)
    assert table.route_for("one") == Route(deployments=["a"])
    assert table.route_for("group") == Route(deployments=["a", "b"])
    assert table.route_for("with-fallback") == Route(deployments=["a", "b"], fallback=["c"])
    # A model no route names goes to every deployment serving it
    assert table.route_for("m") == Route(deployments=["a", "b"])
    assert table.route_for("unknown") is None


@pytest.mark.parametrize("tables, message", [
    ('[deployments.a]\nprovider = "mock"\nmodel = "m"\nrpm = 10\ntpm = 1000\n'
     '[routes]\n"x" = { deployments = ["a"], fallback = ["nope"] }\n',
     "route 'x' names unknown deployment 'nope'"),
    ('[deployments.a]\nprovider = "mock"\nmodel = "m"\nrpm = 10\ntpm = 1000\nquota = "q"\n'
     '[deployments.b]\nprovider = "mock"\nmodel = "m"\nrpm = 20\ntpm = 1000\nquota = "q"\n',
     "share quota 'q' but differ"),
    ('[deployments.a]\nprovider = "mock"\nmodel = "m"\nrpm = 10\ntpm = 1000\n'
     '[routes]\n"x" = []\n', "at least 1 item"),
])
def test_bad_routes_are_refused_with_the_reason(tmp_path, tables: str, message: str) -> None:
    path = tmp_path / "d.toml"
    path.write_text(tables)
    with pytest.raises(ConfigError, match=message):
        load_deployments(path)


def test_a_lone_deployment_waits_out_its_open_circuit_then_gets_the_probe() -> None:
    clock = Clock()
    lone = deployment("lone")
    chooser = router(lone, clock=clock)
    assert chooser.choose(route_of(chooser)).deployment.name == "lone"
    chooser.breaker.record_failure(lone)
    closed_off = chooser.choose(route_of(chooser))
    assert closed_off.deployment is None
    assert closed_off.wait_s == pytest.approx(10.0)
    clock.now += 10.5
    probe = chooser.choose(route_of(chooser))
    assert (probe.deployment.name, probe.probe) == ("lone", True)
    assert chooser.choose(route_of(chooser)).deployment is None  # the probe is out

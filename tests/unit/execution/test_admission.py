"""The admission loop (quotaflow/execution/admission.py) through Admitter.run_route, with
the in-process limiter and circuit breaker and the in-process mock provider: every item
is admitted once, in order, no deployment gets more calls at once than it takes, a line
that cannot go there fails naming why, and the run's hooks are asked before acquiring
and told what was admitted."""

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

from quotaflow.config import Settings
from quotaflow.execution import admission
from quotaflow.execution.admission import Admitter
from quotaflow.execution.attempts import Caller
from quotaflow.execution.batch import BatchRun
from quotaflow.execution.hooks import BatchHook
from quotaflow.providers.base import ProviderResponse
from quotaflow.providers.outcomes import Failure, FailureCode
from quotaflow.results.leases import ClaimedItem
from tests.unit.execution.runs import Journal, Parts, Scripted, deployments, items, outcomes
from tests.unit.execution.runs import route as route_of


def _admit(parts: Parts, run: BatchRun, count: int, max_tokens: int = 8) -> None:
    """Run `count` items through the route, as the embedded runner does (waits slept)."""
    gate = parts.gate()
    admitter = Admitter(None, parts.catalog, gate, Caller(gate),  # type: ignore[arg-type]
                        Settings(), float("inf"))
    asyncio.run(admitter.run_route(run, route_of(parts.catalog), items(count, max_tokens)))


def test_every_item_is_admitted_once_in_order_and_answered(tmp_path: Path) -> None:
    # Given one deployment with room for everything
    journal = Journal()
    parts = Parts(deployments(tmp_path))
    run = parts.run([journal])
    # When 40 items go through the loop
    _admit(parts, run, 40)
    # Then each was answered once, and the chunks admitted were the items in line order
    done = outcomes(run)
    assert sorted(done) == list(range(40))
    assert all(isinstance(outcome, ProviderResponse) for outcome, _ in done.values())
    assert [line for chunk in journal.chunks for line in chunk] == list(range(40))
    assert all(record is not None and record.attempts == 1 for _, record in done.values())


def test_no_deployment_gets_more_calls_at_once_than_its_max_concurrency(tmp_path) -> None:
    # Given a deployment taking 3 calls at once, on a provider slow enough to pile up
    provider = Scripted(latency_s=0.02)
    parts = Parts(deployments(tmp_path, max_concurrency=3), provider)
    run = parts.run()
    # When 12 items go through the loop
    _admit(parts, run, 12)
    # Then all were answered, never more than 3 at once, and no call was made twice
    assert sorted(outcomes(run)) == list(range(12))
    assert provider.most_flying == 3 and provider.calls == 12


def test_a_line_too_large_for_the_budget_fails_naming_why_and_the_rest_go_on(tmp_path) -> None:
    # Given a deployment admitting at most 1000 tokens at once (tpm 1000, a minute's burst)
    parts = Parts(deployments(tmp_path, tpm=1000))
    run = parts.run()
    gate = parts.gate()
    admitter = Admitter(None, parts.catalog, gate, Caller(gate),  # type: ignore[arg-type]
                        Settings(), float("inf"))
    lines = items(3)
    lines[1].body["max_tokens"] = 5000  # this one can never fit
    # When the three go through the loop
    asyncio.run(admitter.run_route(run, route_of(parts.catalog), lines))
    # Then the large one failed before any budget was asked for, and the others were answered
    done = outcomes(run)
    failure = done[1][0]
    assert isinstance(failure, Failure) and failure.code == FailureCode.REQUEST_TOO_LARGE
    assert "1000" in failure.message, failure.message
    assert isinstance(done[0][0], ProviderResponse) and isinstance(done[2][0], ProviderResponse)


def test_a_chunk_the_budget_cannot_take_whole_is_admitted_as_it_refills(tmp_path) -> None:
    # Given a budget of 5 requests at once, refilling at 20 a second
    journal = Journal()
    parts = Parts(deployments(tmp_path, rpm=1200, burst_seconds=0.25, safety_margin_s=0.0))
    run = parts.run([journal])
    # When 9 items go through the loop (waits are slept through, as embedded)
    _admit(parts, run, 9)
    # Then the first chunk was cut short, the rest came as the budget refilled, in order
    assert len(journal.chunks) >= 2 and len(journal.chunks[0]) <= 5, journal.chunks
    assert [line for chunk in journal.chunks for line in chunk] == list(range(9))
    assert sorted(outcomes(run)) == list(range(9))


def test_a_hook_that_asks_for_a_wait_is_asked_again_before_anything_is_admitted(
        tmp_path: Path) -> None:
    # Given a hook that asks twice to wait before the limiter is asked (a tenant ahead
    # of the others on the budget), then lets the run ask
    journal = Journal(waits=[0.01, 0.01])
    parts = Parts(deployments(tmp_path))
    run = parts.run([journal])
    # When 4 items go through the loop
    _admit(parts, run, 4)
    # Then it was asked a third time before the one chunk was admitted, and all answered
    assert journal.asked == 3 and journal.chunks == [[0, 1, 2, 3]]
    assert sorted(outcomes(run)) == [0, 1, 2, 3]


@dataclass
class GivesWayOnce(BatchHook):
    """A hook that hands the run's slot away the first time the loop is about to wait
    (another tenant waits for a worker), as FairShareHook does once per YIELD_S."""

    asked: int = 0

    def before_wait(self) -> bool:
        self.asked += 1
        return self.asked == 1


def test_a_run_that_gives_way_hands_back_every_routes_items(tmp_path, monkeypatch) -> None:
    # Given a batch with lines for two deployments, each taking 1 request a second after
    # the first, and a hook that gives the batch's slot away at the first wait
    (tmp_path / "d.toml").write_text("".join(
        f'[deployments.{name}]\nprovider = "mock"\nmodel = "{name}"\nrpm = 60\n'
        f'tpm = 6000000\nburst_seconds = 1\nsafety_margin_s = 0\n' for name in ("a", "b"))
        + '[routes]\n"a" = "a"\n"b" = "b"\n')
    catalog = Settings(deployments_file=tmp_path / "d.toml").load_deployments()
    parts = Parts(catalog)
    run = parts.run([GivesWayOnce()])
    handed_back: list[int] = []
    monkeypatch.setattr(admission, "release", lambda sessions, job_id, owner, waiting, until:
                        handed_back.extend(item.line_no for item in waiting))
    gate = parts.gate()
    admitter = Admitter(None, catalog, gate, Caller(gate),  # type: ignore[arg-type]
                        Settings(), 5.0)
    lines = [ClaimedItem(n, f"c{n}", {"model": "ab"[n % 2], "max_tokens": 8, "messages": [
        {"role": "user", "content": f"line {n}"}]}, 0) for n in range(10)]

    async def both_routes() -> None:
        routes = {name: catalog.route_named(name) for name in ("a", "b")}
        await asyncio.gather(*(admitter.run_route(run, route, [
            item for item in lines if item.body["model"] == name])
            for name, route in routes.items() if route is not None))

    # When both routes run side by side, as one batch's do
    started = time.monotonic()
    asyncio.run(both_routes())
    # Then each route sent at most its first line and handed every other back at once:
    # the route that did not give way did not keep the slot by waiting out its budget
    sent = sorted(outcomes(run))
    assert 0 in sent and set(sent) <= {0, 1}
    assert sorted(handed_back + sent) == list(range(10))
    assert run.retry_in is not None and time.monotonic() - started < 0.9

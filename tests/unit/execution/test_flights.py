"""The admission loop's calls in flight: counted per deployment, waited on without
touching every call (quotaflow/execution/flights.py)."""

import asyncio
import logging
import time

import pytest

from quotaflow.execution.flights import Flights

pytestmark = pytest.mark.timeout(15)


async def _after(seconds: float, ends: list[str], name: str) -> None:
    await asyncio.sleep(seconds)
    ends.append(name)


def test_calls_are_counted_per_deployment_until_they_end() -> None:
    async def go() -> tuple[list[int], list[int]]:
        flights, ends = Flights(), []
        flights.start("a", _after(0.01, ends, "a1"))
        flights.start("a", _after(0.01, ends, "a2"))
        flights.start("b", _after(0.01, ends, "b1"))
        before = [flights.on("a"), flights.on("b"), len(flights)]
        await flights.finish()
        return before, [flights.on("a"), flights.on("b"), len(flights)]

    assert asyncio.run(go()) == ([2, 1, 3], [0, 0, 0])


def test_one_ends_wakes_at_the_first_end_not_the_last() -> None:
    async def go() -> tuple[list[str], float]:
        flights, ends = Flights(), []
        flights.start("a", _after(0.05, ends, "fast"))
        flights.start("b", _after(0.6, ends, "slow"))
        started = time.monotonic()
        await flights.one_ends()
        waited = time.monotonic() - started
        seen = list(ends)
        await flights.finish()
        return seen, waited

    seen, waited = asyncio.run(go())
    assert seen == ["fast"]
    assert waited < 0.4


def test_none_left_on_waits_for_that_deployment_only_and_no_longer_than_told() -> None:
    async def go() -> tuple[list[str], list[str], float]:
        flights, ends = Flights(), []
        flights.start("a", _after(0.02, ends, "a1"))
        flights.start("a", _after(0.08, ends, "a2"))
        flights.start("b", _after(0.01, ends, "b1"))
        flights.start("c", _after(0.6, ends, "c1"))
        await flights.none_left_on("a", timeout=1.0)
        first = list(ends)
        started = time.monotonic()
        await flights.none_left_on("c", timeout=0.05)  # still in flight when it gives up
        gave_up = time.monotonic() - started
        second = list(ends)
        await flights.finish()
        return first, second, gave_up

    first, second, gave_up = asyncio.run(go())
    assert first == ["b1", "a1", "a2"]  # b's end did not wake the wait on a
    assert second == first  # c was not waited for past the timeout
    assert 0.04 <= gave_up < 0.4


def test_waits_return_at_once_when_nothing_flies() -> None:
    async def go() -> float:
        flights = Flights()
        started = time.monotonic()
        await flights.one_ends()
        await flights.none_left_on("a", timeout=5.0)
        await flights.finish()
        return time.monotonic() - started

    assert asyncio.run(go()) < 0.5


def test_a_call_failing_unexpectedly_is_logged_and_counted_out(caplog) -> None:
    async def broken() -> None:
        raise RuntimeError("boom")

    async def go() -> int:
        flights = Flights()
        flights.start("a", broken())
        await flights.one_ends(timeout=1.0)
        await flights.finish()
        return flights.on("a")

    with caplog.at_level(logging.ERROR, logger="quotaflow.execution.flights"):
        assert asyncio.run(go()) == 0
    assert any("unexpected error" in r.getMessage() and r.exc_info for r in caplog.records)

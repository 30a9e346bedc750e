"""Calls that a local engine can abort are raced against one per-batch stop signal
(quotaflow/execution/abortable.py, JobWatch.signal): the job's status is read on time,
once for all of them, and every call in flight is cancelled when the job ends."""

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from quotaflow.execution.abortable import CallStopped, until_stopped
from quotaflow.execution.stopping import STOP_CHECK_S, JobWatch, SharedReads
from quotaflow.providers.base import ProviderResponse


@dataclass
class ScriptedWatch(JobWatch):
    """A job that is cancelled `cancel_after` seconds from now; counts its reads."""

    cancel_after: float = 0.0
    reads: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._cancel_at = time.monotonic() + self.cancel_after

    def _read(self) -> str | None:
        self.reads.append(time.monotonic())
        return "cancelled" if time.monotonic() >= self._cancel_at else None


@dataclass
class Run:
    watch: JobWatch


async def _engine_call(started: list[str], cancelled: list[str], name: str) -> Any:
    started.append(name)
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        cancelled.append(name)
        raise


def _watch(cancel_after: float, shared: SharedReads | None = None,
           reads: list[float] | None = None, job_id: str = "batch_x") -> ScriptedWatch:
    return ScriptedWatch(sessions=None, job_id=job_id,  # type: ignore[arg-type]
                         cancel_after=cancel_after, shared=shared,
                         reads=[] if reads is None else reads)


def test_every_call_in_flight_is_aborted_within_one_interval_of_the_cancel() -> None:
    async def scenario() -> tuple[float, list[BaseException | Any], list[str], ScriptedWatch]:
        watch = _watch(cancel_after=0.3)
        run = Run(watch)
        started: list[str] = []
        cancelled: list[str] = []
        begun = time.monotonic()
        # Calls join the batch at different moments, as admission lets them in
        calls = []
        for i in range(20):
            calls.append(asyncio.ensure_future(until_stopped(
                run, i + 1, _engine_call(started, cancelled, f"c{i}"))))  # type: ignore[arg-type]
            await asyncio.sleep(0.013)
        results = await asyncio.gather(*calls, return_exceptions=True)
        took = time.monotonic() - begun
        await watch.close()
        return took, results, cancelled, watch

    took, results, cancelled, watch = asyncio.run(scenario())
    # Then all were stopped, each its engine call cancelled, within a check of the cancel
    assert all(isinstance(r, CallStopped) for r in results), results
    assert len(cancelled) == 20
    assert took < 0.3 + STOP_CHECK_S + 0.15, took
    assert "line 1: aborted in the engine" in str(results[0])
    # and the job was read by one reader on its schedule, not once per call
    gaps = [b - a for a, b in zip(watch.reads, watch.reads[1:], strict=False)]
    assert len(watch.reads) <= 3 and all(g >= STOP_CHECK_S - 0.02 for g in gaps), watch.reads


def test_an_answer_that_comes_first_is_returned_and_the_signal_ends_with_the_batch() -> None:
    async def scenario() -> tuple[ProviderResponse, JobWatch]:
        watch = _watch(cancel_after=3600)

        async def answer() -> ProviderResponse:
            await asyncio.sleep(0.05)
            return ProviderResponse(status_code=200, body={"ok": True}, request_id="r",
                                    prompt_tokens=1, completion_tokens=1)

        response = await until_stopped(Run(watch), 1, answer())  # type: ignore[arg-type]
        signal = watch.signal()
        await watch.close()
        assert signal.cancelled()
        return response, watch

    response, _ = asyncio.run(scenario())
    assert response.body == {"ok": True}


def test_a_caller_cancelled_with_its_batch_cancels_the_engine_call() -> None:
    async def scenario() -> list[str]:
        watch = _watch(cancel_after=3600)
        started: list[str] = []
        cancelled: list[str] = []
        call = asyncio.ensure_future(until_stopped(
            Run(watch), 1, _engine_call(started, cancelled, "c")))  # type: ignore[arg-type]
        await asyncio.sleep(0.05)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.sleep(0)
        await watch.close()
        return cancelled

    assert asyncio.run(scenario()) == ["c"]


def test_the_batches_of_one_worker_share_their_reads_of_a_job() -> None:
    """Four batches of a job on one executor read its status once an interval between
    them, and all see its cancel within an interval; another job is read on its own."""
    async def scenario() -> tuple[list[float], list[float], list[float]]:
        shared, reads, other_reads = SharedReads(), [], []
        watches = [_watch(0.6, shared, reads) for _ in range(4)]
        other = _watch(3600, shared, other_reads, job_id="batch_y")
        begun = time.monotonic()
        signals = [w.signal() for w in watches]
        other_signal = other.signal()
        ended = await asyncio.gather(*signals)
        took = time.monotonic() - begun
        assert ended == ["cancelled"] * 4 and not other_signal.done()
        await other.close()
        return reads, other_reads, [took]

    reads, other_reads, (took,) = asyncio.run(scenario())
    assert took < 0.6 + STOP_CHECK_S + 0.15, took
    # 0.0, 0.5, 1.0 (cancelled): one reader each time, not four
    assert len(reads) <= 3, reads
    assert len(other_reads) >= 2  # the other job was not answered from this one's reads

"""A running batch's flusher (quotaflow/execution/flushing.py) sleeps until something is
due: a full chunk is written at once, a partial one once its oldest answer has waited
FLUSH_AFTER_S, and a batch with nothing to write does not wake up at all (it used to
look every 10 ms, which a batch waiting seconds on a model paid for in CPU)."""

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from quotaflow.execution.flushing import flush_when_due
from quotaflow.execution.hooks import Hooks
from quotaflow.execution.writer import FLUSH_AFTER_S, FLUSH_SIZE, ResultWriter


class CountingWriter(ResultWriter):
    """Writes chunks to a list, timed, and counts how often it is asked whether one is due."""

    def __init__(self) -> None:
        super().__init__(sessions=None, job_id="job")  # type: ignore[arg-type]
        self.asked = 0
        self.written: list[tuple[float, int]] = []

    def due_at(self) -> float | None:
        self.asked += 1
        return super().due_at()

    def due(self) -> bool:
        self.asked += 1
        return super().due()

    async def flush(self) -> None:
        chunk, self._buffer, self._provenance = self._buffer, [], []
        self.written.append((time.monotonic(), len(chunk)))


@dataclass
class NoFeedback:
    bell: asyncio.Event | None = None

    def due_at(self) -> float | None:
        return None

    def due(self) -> bool:
        return False


@dataclass
class Run:
    writer: CountingWriter = field(default_factory=CountingWriter)
    feedback: NoFeedback = field(default_factory=NoFeedback)
    hooks: Hooks = field(default_factory=Hooks)


async def _with_flusher(run: Run, body: Any) -> None:
    flusher = asyncio.create_task(flush_when_due(run))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    try:
        await body()
    finally:
        flusher.cancel()


def test_a_batch_with_nothing_to_write_does_not_wake() -> None:
    run = Run()

    async def idle() -> None:
        await asyncio.sleep(0.3)

    asyncio.run(_with_flusher(run, idle))
    assert run.writer.asked <= 2, f"the flusher looked {run.writer.asked} times in 0.3 s"


def test_a_full_chunk_is_written_at_once_a_partial_one_when_it_has_waited() -> None:
    run = Run()

    async def answers() -> None:
        started = time.monotonic()
        for n in range(FLUSH_SIZE):
            run.writer.add(n, None)  # type: ignore[arg-type]
        await asyncio.sleep(0.02)
        assert run.writer.written and run.writer.written[0][1] == FLUSH_SIZE
        assert run.writer.written[0][0] - started < FLUSH_AFTER_S / 2
        run.writer.add(-1, None)  # type: ignore[arg-type]
        one_added = time.monotonic()
        await asyncio.sleep(FLUSH_AFTER_S / 2)
        assert len(run.writer.written) == 1  # not yet due
        await asyncio.sleep(FLUSH_AFTER_S)
        assert [n for _, n in run.writer.written] == [FLUSH_SIZE, 1]
        waited = run.writer.written[1][0] - one_added
        assert FLUSH_AFTER_S <= waited < FLUSH_AFTER_S + 0.05
        asked = run.writer.asked
        await asyncio.sleep(0.2)
        assert run.writer.asked - asked <= 1  # empty again: asleep

    asyncio.run(_with_flusher(run, answers))

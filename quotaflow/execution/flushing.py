"""While a batch runs, settle its feedback and store its answers a chunk at a time; at
its end, store what is left even through a database that is away for a while.

Both used to live in the executor; they are the run's plumbing, not its course.
"""

import asyncio
import contextlib
import logging
import time

from sqlalchemy.exc import OperationalError

from quotaflow.execution.batch import BatchRun

log = logging.getLogger(__name__)

# After a failed write, the next try waits this long (the database may be restarting),
# doubling up to MAX_WRITE_RETRY_S; a batch keeps its answers for KEEP_ANSWERS_S at most.
WRITE_RETRY_S = 1.0
MAX_WRITE_RETRY_S = 5.0
KEEP_ANSWERS_S = 300.0


async def flush_when_due(run: BatchRun) -> None:
    """Settle and store a chunk at a time while the batch runs, not only at its end; the
    hooks' buffers (the metrics tally) are written with each settle.

    It sleeps until the first of the two is due, or until one of them rings its bell
    (something to wait for, or a full chunk). It used to look every 10 ms: a batch
    waiting on slow answers (a model generating for seconds) woke a hundred times a
    second for nothing, which on a small VM cost a batch thread up to a fifth of a
    millisecond of CPU a wake-up, taken from the engine it was waiting on
    (docs/benchmarks.md, "On vLLM's engine")."""
    bell = run.writer.bell = run.feedback.bell = asyncio.Event()
    while True:
        await _until_due(run, bell)
        if run.feedback.due():
            run.feedback.flush()
            run.hooks.flush_all()
        if run.writer.due():
            write = asyncio.ensure_future(run.writer.flush())
            write.add_done_callback(_retrieve)
            try:
                await asyncio.shield(write)
            except asyncio.CancelledError:
                raise
            except Exception:  # kept for the next try; the batch's end raises it
                await asyncio.sleep(WRITE_RETRY_S)


async def _until_due(run: BatchRun, bell: asyncio.Event) -> None:
    while True:
        due = [at for at in (run.feedback.due_at(), run.writer.due_at()) if at is not None]
        wait = min(due) - time.monotonic() if due else None
        if wait is not None and wait <= 0:
            return
        bell.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(bell.wait(), wait)


def _retrieve(task: "asyncio.Future[None]") -> None:
    """A shielded write that fails after its batch moved on has its chunk back in the
    buffer, for the batch's last write; its exception needs no other reader."""
    if not task.cancelled():
        task.exception()


async def store_all(run: BatchRun) -> None:
    """Write every answer the batch holds, waiting out a database that is away (for up
    to KEEP_ANSWERS_S): an answer dropped here would be paid for again when its
    request is sent a second time."""
    delay, deadline = WRITE_RETRY_S, time.monotonic() + KEEP_ANSWERS_S
    while True:
        try:
            await run.writer.flush()
            return
        except OperationalError as exc:
            if time.monotonic() > deadline:
                raise
            log.warning("storing %d answers of %s failed (%s); trying again in %.0fs",
                        run.writer.waiting, run.ref.job_id, exc.__class__.__name__, delay,
                        extra=run.context)
            await asyncio.sleep(delay)
            delay = min(2 * delay, MAX_WRITE_RETRY_S)

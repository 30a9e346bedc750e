"""Calls a job's cancel or expiry reaches while they are in flight.

A call sent to a remote provider finishes and keeps its result (stopping.py):
once sent, it is paid for. A request in a local engine is different: it may
wait behind a bulk flood in vLLM's queue for minutes, holding KV cache, and
aborting it costs nothing. A provider that says so (`aborts_when_stopped`)
has its calls raced against the job's watch (one signal per batch, JobWatch.signal):
within STOP_CHECK_S of the job ending, the call is cancelled (the engine aborts the
request) and the item ends as cancelled or expired, like the items never sent.
"""

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

from quotaflow.errors import QuotaflowError
from quotaflow.execution.batch import BatchRun
from quotaflow.execution.stopping import CODES
from quotaflow.providers.base import ProviderResponse
from quotaflow.providers.outcomes import NOT_SENT_BECAUSE, Failure


class CallStopped(QuotaflowError):
    """The job ended while the call was in the engine; the call was aborted."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


def aborts_when_stopped(provider: object) -> bool:
    return bool(getattr(provider, "aborts_when_stopped", False))


async def until_stopped(run: BatchRun, line_no: int,
                        call: Coroutine[Any, Any, ProviderResponse]) -> ProviderResponse:
    """The call's answer, or CallStopped once the job ended first (the call cancelled)."""
    task = asyncio.ensure_future(call)
    stopped = run.watch.signal()
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if task.done() or not stopped.done() or stopped.cancelled():
            return await task
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        ended = stopped.result()
        raise CallStopped(Failure(
            CODES[ended], f"line {line_no}: aborted in the engine because "
                          f"{NOT_SENT_BECAUSE[ended]}"))
    finally:
        if not task.done():  # our caller was cancelled (its batch ends): abort too
            task.cancel()

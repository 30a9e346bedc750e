"""The calls a batch run has in flight, counted per deployment, and waits for them to end.

The admission loop (admission.py) asks before every chunk which deployments are full,
and waits for calls to end: for a slot when all are taken, for a few more answers
before it asks the limiter again. It kept a set of tasks per deployment, rebuilt each
round to forget the finished ones, and waited with `asyncio.wait`, which puts a
callback on every call in flight and takes each off again, for a chunk of a dozen
requests. Here a call tells its end once, through the one callback it gets when it
starts, to a counter and to the wait that is pending, if any, so the admission loop
does no work per call in flight.
"""

import asyncio
import logging
from collections.abc import Coroutine
from functools import partial
from typing import Any

log = logging.getLogger(__name__)


class Flights:
    """Calls started by one admission loop, which alone waits on them."""

    def __init__(self) -> None:
        self._count: dict[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._waiter: asyncio.Future[None] | None = None
        self._until_none_on: str | None = None  # the pending wait's deployment, if any

    def __len__(self) -> int:
        return len(self._tasks)

    def on(self, deployment: str) -> int:
        """Calls in flight on the deployment."""
        return self._count.get(deployment, 0)

    def start(self, deployment: str, call: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(call)
        self._tasks.add(task)
        self._count[deployment] = self._count.get(deployment, 0) + 1
        task.add_done_callback(partial(self._ended, deployment))

    def _ended(self, deployment: str, task: "asyncio.Task[None]") -> None:
        self._tasks.discard(task)
        left = self._count[deployment] = self._count[deployment] - 1
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("a call ended with an unexpected error", exc_info=exc)
        waiter = self._waiter
        if waiter is not None and not waiter.done() and (
                self._until_none_on is None or (left == 0 and deployment == self._until_none_on)):
            waiter.set_result(None)

    async def one_ends(self, timeout: float | None = None) -> None:
        """Until any call ends, or `timeout` seconds pass."""
        if self._tasks:
            await self._wait(None, timeout)

    async def none_left_on(self, deployment: str, timeout: float) -> None:
        """Until the deployment has no call in flight, or `timeout` seconds pass."""
        if self.on(deployment):
            await self._wait(deployment, timeout)

    async def _wait(self, deployment: str | None, timeout: float | None) -> None:
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        self._until_none_on = deployment

        def wake() -> None:
            if not waiter.done():
                waiter.set_result(None)

        timer = None if timeout is None else loop.call_later(timeout, wake)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    async def finish(self) -> None:
        """Until every call started has ended (they are stored, whatever ended the loop)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

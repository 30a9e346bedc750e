"""The worker's background loops (provider batches, webhook deliveries, the reaper):
rounds on a thread of the worker's main process until the worker shuts down.

One skeleton for them all: the first round at once, then one every interval, or at once
again while a round found more due than it could claim; a failed round (Redis or
PostgreSQL away) is logged and tried again, never the end of the loop.

No receiver of Celery's `worker_shutting_down` tells them to stop: Celery sends it from
inside its SIGINT/SIGTERM handler, where a receiver's lock (threading.Event.set), and the
lock Celery's own dispatch takes once a signal has any receiver, can be interrupted by
the next signal and waited on forever by that signal's handler, in the same thread
(a worker stopped with Ctrl-C stayed up). The loops look instead at the flags that
handler sets by plain assignment, at least every STOP_POLL_S, and at `worker_shutdown`,
which Celery sends from its main flow.
"""

import logging
import threading
import time
from collections.abc import Callable

from celery.signals import worker_shutdown
from celery.worker import state

log = logging.getLogger(__name__)
STOP_POLL_S = 0.5  # the most a loop goes on after its worker began to shut down
_ended = threading.Event()


def stopping() -> bool:
    """Whether the worker shuts down: a signal's handler set Celery's flag (its exit code,
    0 for a warm shutdown: None is "running"), or the worker has stopped."""
    return (state.should_stop is not None or state.should_terminate is not None
            or _ended.is_set())


def pause(seconds: float) -> bool:
    """Wait up to `seconds`; True as soon as the worker is stopping."""
    deadline = time.monotonic() + seconds
    while not stopping():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        _ended.wait(min(left, STOP_POLL_S))
    return True


def run_rounds(what: str, round_: Callable[[], bool], interval: float,
               close: Callable[[], None] = lambda: None) -> None:
    """Call `round_` until the worker shuts down; it answers whether more are due now."""
    delay = 0.0
    try:
        while not pause(delay):
            delay = interval
            try:
                if round_():
                    delay = 0.0  # more are due: no pause
            except Exception:  # a Postgres or Redis outage must not end the loop
                log.exception("%s round failed; trying again in %.1fs", what, interval)
    finally:
        close()


def start(name: str, target: Callable[[], None]) -> None:
    threading.Thread(target=target, name=name, daemon=True).start()


@worker_shutdown.connect
def stop_rounds(**_kwargs: object) -> None:
    """From Celery's main flow once the worker has stopped, never a signal handler."""
    _ended.set()

"""The worker's background loops (provider batches, webhook deliveries): rounds on a
thread of the worker's main process until the worker shuts down.

One skeleton for them all: the first round at once, then one every interval, or at once
again while a round found more due than it could claim; a failed round (Redis or
PostgreSQL away) is logged and tried again, never the end of the loop.
"""

import logging
import threading
from collections.abc import Callable

from celery.signals import worker_shutting_down

log = logging.getLogger(__name__)
_stop = threading.Event()


def run_rounds(what: str, round_: Callable[[], bool], interval: float,
               close: Callable[[], None] = lambda: None) -> None:
    """Call `round_` until the worker shuts down; it answers whether more are due now."""
    delay = 0.0
    try:
        while not _stop.wait(delay):
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


@worker_shutting_down.connect
def stop_rounds(**_kwargs: object) -> None:
    _stop.set()

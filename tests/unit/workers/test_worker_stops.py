"""How a worker is told to stop, without a lock in a signal handler (#46): its loops
look at Celery's stop flags (workers/rounds.py), and the supervisor of `quotaflow worker`
(cli/worker_group.py) passes each further stop signal on harder, as Celery reads them.
tests/cluster/test_signal_paths.py runs Celery's handler itself; tests/cluster/
test_clean_ends.py stops each command."""

import signal
import threading

from celery.worker import state

from cli.worker_group import escalation
from workers import rounds


def test_each_further_stop_signal_asks_harder() -> None:
    assert [escalation(n) for n in (1, 2, 3, 4)] == [
        signal.SIGTERM,  # warm: batches in hand finish
        signal.SIGQUIT,  # cold: they go back to their queue
        signal.SIGKILL, signal.SIGKILL]


def test_pause_ends_as_soon_as_celery_sets_its_stop_flag() -> None:
    assert rounds.pause(0.01) is False
    answered: list[bool] = []
    waiter = threading.Thread(target=lambda: answered.append(rounds.pause(60)))
    waiter.start()
    state.should_stop = 0  # a warm shutdown's exit code: 0, and still "stopping"
    try:
        waiter.join(rounds.STOP_POLL_S * 4)
        assert answered == [True]
        assert rounds.pause(60) is True
    finally:
        state.should_stop = None
        waiter.join(1)

"""Every long-running command ends within STOP_WITHIN_S of SIGINT or SIGTERM, however
many times and to whichever of its processes the signal comes: the suite's quick pass.

A worker stopped with Ctrl-C once stayed up in 1 of 3 tries: its signal handlers took a
lock (threading.Event.set, Celery's receiver list) that a second signal, arriving inside
the first handler, waited on forever. So each command is started fresh each round,
stopped with the round's way of telling it (tests/harness/stopping.py), and its group's
processes are counted until none is left. test_clean_ends_soak.py sends each way twenty
times to every command.
"""

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.servers import REDIS_URL, flush_redis, service_env
from tests.harness.stopping import COMMANDS, Command, Stop, launch, left_after, wait_up

pytestmark = pytest.mark.timeout(300)

# Each round of a command takes the next of these.
STOPS = [
    Stop(True, signal.SIGINT),
    Stop(False, signal.SIGTERM),
    Stop(True, signal.SIGINT, 2, 0.0),
    Stop(False, signal.SIGTERM, 2, 0.0),
    Stop(True, signal.SIGTERM, 2, 0.002),
    Stop(False, signal.SIGINT, 2, 0.02),
    Stop(True, signal.SIGINT, 2, 0.3),
]


@pytest.fixture(scope="module")
def env(pg_url: str) -> Iterator[dict[str, str]]:
    flush_redis(REDIS_URL)
    yield service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                      QUOTAFLOW_REAP_INTERVAL_S="1")


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
def test_every_process_ends_within_seconds_of_each_way_of_stopping(
        command: Command, env: dict[str, str], tmp_path: Path) -> None:
    failures = []
    for n in range(command.rounds):
        stop = STOPS[n % len(STOPS)]
        proc, port = launch(command, env, tmp_path, n)
        try:
            wait_up(command, proc, port)
            began = time.monotonic()
            stop.send(proc.pid)
            left = left_after([proc], began).get(proc)
            if left:
                failures.append(f"round {n}, {stop}: {len(left)} left after "
                                f"{time.monotonic() - began:.1f} s: {left}\n{proc.log(3000)}")
        finally:
            proc.stop(timeout=5)
    assert not failures, "\n\n".join(failures)

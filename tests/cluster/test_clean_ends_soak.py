"""Each way of telling a command to stop, twenty times, to every long-running command.

Three ways: to the process group (as a terminal's Ctrl-C), to the supervisor alone (as
docker or systemd), and twice in a row (to either, at gaps from none to 300 ms, the
second arriving while the first one's handler may still run); SIGINT and SIGTERM in
turn. Each wave starts WAVE instances of a command at once, tells each the same way when
all are up, and counts what is left of every group STOP_WITHIN_S later.

Twenty rounds of each of 18 pairs take about 13 minutes of two cores, so this
runs on demand (`pytest -m soak`; docs/operations/stopping.md), outside scripts/test;
test_clean_ends.py is the suite's quick pass over the same commands and ways.
"""

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.procs import Proc
from tests.harness.servers import REDIS_URL, flush_redis, service_env
from tests.harness.stopping import COMMANDS, Command, Stop, launch, left_after, wait_up

pytestmark = [pytest.mark.soak, pytest.mark.timeout(1800)]

ROUNDS = 20
WAVE = 5
SIGNALS = (signal.SIGINT, signal.SIGTERM)
GAPS_S = (0.0, 0.002, 0.02, 0.3)


def _group(n: int) -> Stop:
    return Stop(True, SIGNALS[n % 2])


def _supervisor(n: int) -> Stop:
    return Stop(False, SIGNALS[n % 2])


def _twice(n: int) -> Stop:
    return Stop(n % 4 < 2, SIGNALS[n % 2], 2, GAPS_S[(n // 2) % len(GAPS_S)])


WAYS = {"group": _group, "supervisor": _supervisor, "twice": _twice}


@pytest.fixture(scope="module")
def env(pg_url: str) -> Iterator[dict[str, str]]:
    flush_redis(REDIS_URL)
    yield service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                      QUOTAFLOW_REAP_INTERVAL_S="1")


def _wave(command: Command, rounds: range, way: str, env: dict[str, str],
          workdir: Path) -> list[str]:
    procs: list[tuple[int, Proc]] = []
    try:
        started = [(n, *launch(command, env, workdir, n)) for n in rounds]
        procs = [(n, proc) for n, proc, _port in started]
        for _n, proc, port in started:
            wait_up(command, proc, port)
        stops = {proc: WAYS[way](n) for n, proc in procs}
        began = time.monotonic()
        for proc, stop in stops.items():
            stop.send(proc.pid)
        left = left_after([proc for _n, proc in procs], began)
        return [f"round {n}, {stops[proc]}: {len(left[proc])} left: {left[proc]}\n"
                f"{proc.log(2000)}" for n, proc in procs if proc in left]
    finally:
        for _n, proc in procs:
            proc.stop(timeout=5)


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
def test_each_way_twenty_times(command: Command, way: str, env: dict[str, str],
                               tmp_path: Path) -> None:
    failures: list[str] = []
    for first in range(0, ROUNDS, WAVE):
        failures += _wave(command, range(first, first + WAVE), way, env, tmp_path)
    assert not failures, f"{len(failures)} of {ROUNDS} rounds left processes:\n\n" + \
        "\n\n".join(failures)

"""Every long-running command ends within STOP_WITHIN_S of SIGINT or SIGTERM, however
many times and to whichever of its processes the signal comes (#46, "Clean ends").

A worker stopped with Ctrl-C stayed up in 1 of 3 tries: its signal handlers took a lock
(threading.Event.set, Celery's receiver list) that a second signal, arriving inside the
first handler, waited on forever. So each command is started fresh each round, stopped
with one combination of the ways it is told (SIGINT to its process group, as a terminal
sends it; SIGTERM to the process started alone, as docker or systemd send it; the same
twice in a row, at gaps from none to a few hundred ms), and its group's processes are
counted until none is left.
"""

import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

from tests.harness import served_by
from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import REDIS_URL, service_env

pytestmark = pytest.mark.timeout(300)

STOP_WITHIN_S = 10.0


@dataclass(frozen=True)
class Stop:
    """One way a command is told to stop: `signum` to its group or to its first process,
    `times` times with `gap_s` between."""

    to_group: bool
    signum: signal.Signals
    times: int = 1
    gap_s: float = 0.0

    def __str__(self) -> str:
        to = "group" if self.to_group else "leader"
        return f"{self.signum.name} x{self.times} to the {to} (gap {self.gap_s:g} s)"

    def send(self, pid: int) -> None:
        for n in range(self.times):
            if n:
                time.sleep(self.gap_s)
            if self.to_group:
                os.killpg(pid, self.signum)
            else:
                os.kill(pid, self.signum)


# Each round of a command takes the next of these (a second signal close to the first is
# the one that met a handler still running).
STOPS = [
    Stop(True, signal.SIGINT),
    Stop(False, signal.SIGTERM),
    Stop(True, signal.SIGINT, 2, 0.0),
    Stop(False, signal.SIGTERM, 2, 0.0),
    Stop(True, signal.SIGTERM, 2, 0.002),
    Stop(False, signal.SIGINT, 2, 0.02),
    Stop(True, signal.SIGINT, 2, 0.3),
]


@dataclass(frozen=True)
class Command:
    """A command, when it is up (all its processes started), and the rounds it gets."""

    name: str
    args: tuple[str, ...]
    processes: int  # the group's processes once up
    rounds: int
    up: Callable[[Proc, int], bool]


def _logged(times: int, text: str) -> Callable[[Proc, int], bool]:
    return lambda proc, _port: proc.log(200_000).count(text) >= times


def _healthy(path: str) -> Callable[[Proc, int], bool]:
    return lambda _proc, port: httpx.get(f"http://127.0.0.1:{port}{path}",
                                         timeout=2).status_code == 200


# Each worker's Celery says " ready." when its signal handlers and loops (the reaper, the
# webhook deliverer) are up. 20 rounds in all for the worker with its companion, the
# command of the report; the others get fewer, to keep the file within minutes.
COMMANDS = [
    Command("worker", ("worker", "--concurrency", "1", "--realtime-slots", "1"), 4, 10,
            _logged(2, " ready.")),
    Command("worker-alone", ("worker", "--concurrency", "1", "--realtime-slots", "0"), 2, 3,
            _logged(1, " ready.")),
    Command("api", ("api",), 1, 2, _healthy("/healthz")),
    Command("api-2", ("api", "--workers", "2"), 4, 3, _healthy("/healthz")),
    Command("flower", ("flower", "--no-auth"), 1, 2, _healthy("/healthcheck")),
]


@pytest.fixture(scope="module")
def env(pg_url: str) -> Iterator[dict[str, str]]:
    redis.Redis.from_url(REDIS_URL).flushdb()
    yield service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                      QUOTAFLOW_REAP_INTERVAL_S="1")


def _start(command: Command, env: dict[str, str], workdir: Path, n: int) -> Proc:
    port = free_port()
    ports = {"api": "--port", "flower": "--port"}
    verb = command.args[0]
    args = [*command.args, ports[verb], str(port)] if verb in ports else [*command.args]
    if verb == "worker":
        args += ["--name", f"ends-{command.name}-{n}@qftest"]
    proc = Proc(f"{command.name}-{n}", quotaflow(*args), env, workdir)
    proc.wait_until(lambda: command.up(proc, port) and
                    len(served_by.group(proc.pid)) >= command.processes, timeout=90)
    return proc


def _ends(proc: Proc, stop: Stop) -> tuple[list[str], float]:
    """Stop it; what is left of its group STOP_WITHIN_S later, and how long it took."""
    began = time.monotonic()
    stop.send(proc.pid)
    left = served_by.group(proc.pid)
    while left and time.monotonic() - began < STOP_WITHIN_S:
        proc.popen.poll()  # the leader reaped, as soon as it ends
        time.sleep(0.05)
        left = served_by.group(proc.pid)
    return [_cmdline(pid) for pid in left], time.monotonic() - began


def _cmdline(pid: int) -> str:
    try:
        return f"{pid} " + Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")[:160]
    except OSError:
        return str(pid)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c.name)
def test_every_process_ends_within_seconds_of_each_way_of_stopping(
        command: Command, env: dict[str, str], tmp_path: Path) -> None:
    failures = []
    for n in range(command.rounds):
        stop = STOPS[n % len(STOPS)]
        proc = _start(command, env, tmp_path, n)
        try:
            left, took = _ends(proc, stop)
            if left:
                failures.append(f"round {n}, {stop}: {len(left)} left after {took:.1f} s: "
                                f"{left}\n{proc.log(3000)}")
        finally:
            proc.stop(timeout=5)
    assert not failures, "\n\n".join(failures)

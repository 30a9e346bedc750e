"""The supervisor of a plain `quotaflow worker` (cli/worker_group.py): its two Celery
workers live and end together. Children here are small Python processes standing in for
them, so each property is seen directly: a SIGTERM to the supervisor alone (docker stop,
systemd) reaches both; one child ending ends the other and is the command's status; a
SIGKILLed supervisor leaves no orphan consuming queues; each further stop signal asks
harder, and a worker stuck in its shutdown is killed."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli.worker_group import KILL_AFTER_S
from tests.harness import served_by

pytestmark = pytest.mark.timeout(120)

# A child that records the signal that ended it, or exits with a status after a delay.
CHILD = """
import signal, sys, time
out = sys.argv[1]
def ended(signum, _frame):
    open(out, "w").write(signal.Signals(signum).name)
    sys.exit(0)
signal.signal(signal.SIGTERM, ended)
signal.signal(signal.SIGINT, ended)
open(out + ".up", "w").write("up")
if len(sys.argv) > 2:
    time.sleep(float(sys.argv[2]))
    sys.exit(int(sys.argv[3]))
while True:
    time.sleep(0.1)
"""

# A worker stuck in its shutdown: it notes each signal and stays.
STUBBORN = """
import signal, sys, time
out = sys.argv[1]
def noted(signum, _frame):
    open(out, "a").write(signal.Signals(signum).name + " ")
for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
    signal.signal(signum, noted)
open(out + ".up", "w").write("up")
while True:
    time.sleep(0.1)
"""

SUPERVISOR = """
import sys
from cli.worker_group import Child, run_group
children = [Child([sys.executable, "-c", sys.argv[1], *arg.split()], {})
            for arg in sys.argv[2:]]
sys.exit(run_group(children))
"""


def supervise(tmp_path: Path, *children: str, child: str = CHILD) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", SUPERVISOR, child, *children],
                            start_new_session=True, env={**os.environ})


def wait_for(path: Path, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.05)
    raise TimeoutError(path)


def test_a_sigterm_to_the_supervisor_alone_reaches_both(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    proc = supervise(tmp_path, str(a), str(b))
    try:
        wait_for(Path(f"{a}.up")), wait_for(Path(f"{b}.up"))
        os.kill(proc.pid, signal.SIGTERM)  # the pid only, not its group
        assert proc.wait(30) == 0
        assert (wait_for(a), wait_for(b)) == ("SIGTERM", "SIGTERM")
    finally:
        _end(proc)


def test_one_child_ending_ends_the_other_with_its_status(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    proc = supervise(tmp_path, str(a), f"{b} 1.0 3")
    try:
        assert proc.wait(30) == 3  # the child that ended first decides the status
        assert wait_for(a) == "SIGTERM"
    finally:
        _end(proc)


def test_a_killed_supervisor_leaves_no_orphan(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    proc = supervise(tmp_path, str(a), str(b))
    try:
        wait_for(Path(f"{a}.up")), wait_for(Path(f"{b}.up"))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        # the kernel sends each child SIGTERM when its parent dies (PR_SET_PDEATHSIG)
        assert (wait_for(a), wait_for(b)) == ("SIGTERM", "SIGTERM")
    finally:
        _end(proc)


def test_each_further_signal_asks_harder_and_a_stuck_worker_is_killed(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    proc = supervise(tmp_path, str(a), str(b), child=STUBBORN)
    try:
        wait_for(Path(f"{a}.up")), wait_for(Path(f"{b}.up"))
        os.kill(proc.pid, signal.SIGTERM)
        assert (wait_for(a), wait_for(b)) == ("SIGTERM ", "SIGTERM ")  # warm
        os.kill(proc.pid, signal.SIGINT)
        began = time.monotonic()
        deadline = began + 10
        while "SIGQUIT" not in a.read_text() + b.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (a.read_text(), b.read_text()) == ("SIGTERM SIGQUIT ",) * 2  # cold
        # Still there KILL_AFTER_S later: killed, and the supervisor ends.
        proc.wait(KILL_AFTER_S + 5)
        assert time.monotonic() - began >= KILL_AFTER_S - 0.5
        assert served_by.group(proc.pid) == []
    finally:
        _end(proc)


def _end(proc: subprocess.Popen[bytes]) -> None:
    """Whatever the test left of the group we started, by its pid."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)

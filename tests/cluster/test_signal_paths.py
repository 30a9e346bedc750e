"""What runs inside a worker's signal handlers takes no lock (#46, "Clean ends").

Celery's SIGINT/SIGTERM handler sends `worker_shutting_down`. A worker stopped with Ctrl-C
stayed up: the reaper's receiver set a threading.Event, and a second signal arriving while
the first handler held the Event's lock ran the handler again, in the same thread, to
wait on that lock forever. Celery's dispatch takes a lock of its own too, whenever the
signal has a receiver. So no module of the worker connects one (workers/rounds.py), and
Celery's real handler, interrupted at each line it runs by the same signal, returns.
And the supervisor's last resort, a kill, reaches a worker's own children.
"""

import os
import signal
import subprocess
import sys

from cli.worker_group import descendants
from tests.harness.servers import ROOT

# The worker's modules, as `celery -A workers.app:app worker` imports them.
WORKER_MODULES = """
import workers.app, workers.tasks, workers.reaper, workers.webhooks, workers.offload
import workers.metrics, workers.rounds
"""

# Celery's SIGTERM handler, run once per line it executes, with another SIGTERM sent at
# that line (the nested handler runs there, in the same thread, as a real one would).
REENTERED = WORKER_MODULES + """
import os, signal, sys, threading
from types import SimpleNamespace
from celery.apps.worker import install_worker_term_handler
from workers import rounds

threading.Thread(target=rounds.pause, args=(60,), daemon=True).start()
install_worker_term_handler(SimpleNamespace(hostname="w@h"))
handler = signal.getsignal(signal.SIGTERM)
seen, at = [0], [0]

def tracer(frame, event, arg):
    if event == "line":
        seen[0] += 1
        if seen[0] == at[0]:
            os.kill(os.getpid(), signal.SIGTERM)
    return tracer

line = 1
while True:
    seen[0], at[0] = 0, line
    sys.settrace(tracer)
    handler(signal.SIGTERM, None)
    sys.settrace(None)
    if seen[0] < line:
        break
    line += 1
print("interrupted at", line - 1, "lines")
"""


def _run(script: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QUOTAFLOW_BROKER_URL": "redis://127.0.0.1:1/0"}  # never reached
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=30)


def test_no_worker_module_receives_worker_shutting_down() -> None:
    done = _run(WORKER_MODULES + """
from celery.signals import worker_shutting_down
print(len(worker_shutting_down.receivers))
""")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0"]


def test_celerys_handler_interrupted_at_any_line_by_the_next_signal_returns() -> None:
    try:
        done = _run(REENTERED)
    except subprocess.TimeoutExpired as exc:  # the old Event.set waited here forever
        raise AssertionError(f"a nested SIGTERM handler hung: {exc.stderr!r}") from None
    assert done.returncode == 0, done.stderr
    assert "interrupted at" in done.stdout


def test_descendants_are_children_and_theirs() -> None:
    # A child that starts a grandchild and waits, as a Celery worker on its pool.
    script = ("import subprocess, sys; print(subprocess.Popen(['sleep', '30']).pid, "
              "flush=True); sys.stdin.read()")
    with subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None
        grandchild = int(child.stdout.readline())
        try:
            # (this process may have other children: servers an earlier test started)
            found = descendants(os.getpid())
            assert child.pid in found and grandchild in found
            assert found.index(child.pid) < found.index(grandchild)
            assert descendants(child.pid) == [grandchild]
            assert descendants(grandchild) == []
        finally:
            os.kill(grandchild, signal.SIGKILL)
            child.kill()
    assert descendants(2**22 + 1) == []  # no such process: none

"""One `quotaflow worker` as two Celery workers: the main pool, and a slot kept for realtime.

Celery has no per-queue concurrency: a worker consuming realtime, standard and bulk
fills each free pool slot with whatever message its round-robin over the queues finds
first, and a bulk batch holds its slot for as long as the budget takes to send its
lines (tens of seconds under a flood). A realtime message then waits for a slot, and
the shared layout's realtime p95 was 16.5 s against 0.32 s with compose's split
workers (docs/benchmarks.md, "Realtime under a bulk flood").

So a plain `quotaflow worker` that consumes realtime beside other queues starts a
second, small Celery worker beside its main one: `--realtime-slots` threads that
consume the realtime queue alone, so one of them is always waiting on it, while the
main pool keeps every queue (realtime included, to absorb realtime bursts). That is
the split layout inside one command. The companion runs no webhook delivery and no
provider batch loop (the main worker does), and serves no metrics port of its own:
it writes its counters into the main worker's multiprocess directory, which the main
worker serves as one endpoint.

This process only supervises, and takes no signal in a handler: SIGINT and SIGTERM are
blocked and read in its loop (sigwaitinfo), so a second signal can never interrupt the
first one's work. Each stop signal is passed on, harder each time, as Celery reads them:
the first as SIGTERM (a warm shutdown: batches in hand finish), the second as SIGQUIT (a
cold one: they go back to their queue), any further as SIGKILL, and a child still there
KILL_AFTER_S after the cold shutdown was asked is killed. When either worker ends by
itself the other is ended too, and the command exits with the first one's status, so a
process manager restarts the pair. Each child asks the kernel for SIGTERM if this process
dies (a SIGKILL of the supervisor alone leaves no orphan consuming queues).
"""

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

PR_SET_PDEATHSIG = 1
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# A child still running this long after the cold shutdown was asked is killed; one still
# running this long after the other ended by itself too (it may have batches to finish).
KILL_AFTER_S = 5.0
ENDED_KILL_AFTER_S = 90.0
# The companion's node name: the main worker's name with this before the '@'.
COMPANION_SUFFIX = "-realtime"


@dataclass(frozen=True)
class Child:
    """One Celery worker the group starts: its argv, the environment it adds to this
    process's, and the variables it must not inherit."""

    argv: list[str]
    env: dict[str, str]
    drop: tuple[str, ...] = ()

    def environ(self) -> dict[str, str]:
        inherited = {k: v for k, v in os.environ.items() if k not in self.drop}
        return {**inherited, **self.env}


def companion_node(node: str) -> str:
    """'quotaflow-12@host' -> 'quotaflow-12-realtime@host' (Celery's name@host form)."""
    name, at, host = node.partition("@")
    return f"{name}{COMPANION_SUFFIX}{at}{host}"


def _child_setup(supervisor: int, mask: set[int]) -> None:
    """In the child, before exec: the signal mask the supervisor had before it blocked its
    own, and SIGTERM when the supervisor dies (Linux's prctl); a supervisor already gone
    (before the prctl) ends the child at once."""
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    libc_name = ctypes.util.find_library("c")
    if libc_name:
        ctypes.CDLL(libc_name, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != supervisor:
        os._exit(1)


def escalation(stops: int) -> signal.Signals:
    """What each child is sent for the supervisor's `stops`-th SIGINT or SIGTERM: Celery's
    warm shutdown, then its cold one, then the end."""
    return {1: signal.SIGTERM, 2: signal.SIGQUIT}.get(stops, signal.SIGKILL)


def descendants(pid: int) -> list[int]:
    """Every process under `pid` (a Celery worker's pool processes), read from /proc."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as listed:
                for child in map(int, listed.read().split()):
                    found += [child, *descendants(child)]
    return found


class Group:
    """The children, as the loop sees them: which live, which ended first, and a signal
    to every one still running (SIGKILL to their own children too: a Celery worker killed
    alone would leave its pool processes)."""

    def __init__(self, procs: list[subprocess.Popen[bytes]]) -> None:
        self.procs = procs
        self.first: subprocess.Popen[bytes] | None = None

    def living(self) -> list[subprocess.Popen[bytes]]:
        living = [proc for proc in self.procs if proc.poll() is None]
        if self.first is None:
            self.first = next((proc for proc in self.procs if proc.returncode is not None),
                              None)
        return living

    def send(self, signum: signal.Signals) -> None:
        for proc in self.living():
            pids = [*descendants(proc.pid), proc.pid] if signum == signal.SIGKILL else [proc.pid]
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)


def run_group(children: Sequence[Child]) -> int:
    """Start the children, wait for the first to end, end the rest; its exit status."""
    watched = {*STOP_SIGNALS, signal.SIGCHLD}
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, watched)  # read by sigwaitinfo below
    supervisor = os.getpid()
    group = Group([subprocess.Popen(child.argv, env=child.environ(),
                                    preexec_fn=lambda: _child_setup(supervisor, mask))
                   for child in children])
    stops, kill_at = 0, None
    ending = False
    while group.living():
        if not (ending or stops) and group.first is not None:
            ending = True  # one ended by itself: the others follow
            group.send(signal.SIGTERM)
            kill_at = _sooner(kill_at, ENDED_KILL_AFTER_S)
        signum = _next_signal(watched, kill_at)
        if signum in STOP_SIGNALS:
            # A signal to the whole group (Ctrl-C) reached the children already; passing
            # it on as well does no harm (Celery takes a second warm request as the first).
            stops += 1
            group.send(escalation(stops))
            if stops == 2:
                kill_at = _sooner(kill_at, KILL_AFTER_S)
        elif signum is None:
            group.send(signal.SIGKILL)
            kill_at = None  # the SIGCHLDs of their ends come next
    first = group.first or group.procs[0]
    code = first.returncode if first.returncode is not None else 1
    return code if code >= 0 else 128 - code


def _sooner(kill_at: float | None, after_s: float) -> float:
    at = time.monotonic() + after_s
    return at if kill_at is None else min(kill_at, at)


def _next_signal(watched: set[signal.Signals], kill_at: float | None) -> int | None:
    """The next of `watched` to come (a child's end is SIGCHLD), or None at `kill_at`.
    No timer while nothing is due: a timed wait fails under libfaketime's shifted clocks,
    which multi-host tests run workers with."""
    if kill_at is None:
        return signal.sigwaitinfo(watched).si_signo
    info = signal.sigtimedwait(watched, max(0.0, kill_at - time.monotonic()))
    return None if info is None else info.si_signo


def exec_or_group(children: Sequence[Child]) -> None:
    """One child: become it (exec, as before); several: supervise them."""
    if len(children) == 1:
        [child] = children
        os.execvpe(child.argv[0], child.argv, child.environ())
    sys.exit(run_group(children))

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

This process only supervises: it forwards SIGTERM, and when either worker ends it ends
the other and exits with the first one's status, so a process manager restarts the
pair. Each child asks the kernel for SIGTERM if this process dies (a SIGKILL of the
supervisor alone leaves no orphan consuming queues).
"""

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType

PR_SET_PDEATHSIG = 1
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


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the supervisor dies (Linux's prctl)."""
    libc_name = ctypes.util.find_library("c")
    if libc_name:
        ctypes.CDLL(libc_name, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def run_group(children: Sequence[Child]) -> int:
    """Start the children, wait for the first to end, end the rest; its exit status."""
    procs = [subprocess.Popen(child.argv, env=child.environ(),
                              preexec_fn=_die_with_parent) for child in children]
    forwarded = False

    def forward(signum: int, _frame: FrameType | None) -> None:
        # A process group signal (Ctrl+C, `kill -- -PGID`) already reached the children;
        # a signal to this pid alone (docker stop, systemd) must be passed on, once:
        # Celery takes a second SIGINT as a cold shutdown.
        nonlocal forwarded
        if forwarded:
            return
        forwarded = True
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while all(proc.poll() is None for proc in procs):
        # Until a child ends, left for poll() to reap: no timer (a sleeping loop fails
        # under libfaketime's shifted clocks, which multi-host tests run workers with).
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
    first = next(proc for proc in procs if proc.returncode is not None)
    forward(signal.SIGTERM, None)
    for proc in procs:
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    code = first.returncode
    return code if code >= 0 else 128 - code


def exec_or_group(children: Sequence[Child]) -> None:
    """One child: become it (exec, as before); several: supervise them."""
    if len(children) == 1:
        [child] = children
        os.execvpe(child.argv[0], child.argv, child.environ())
    sys.exit(run_group(children))

"""The processes an engine started, found and ended by pid.

vLLM runs its engine core in a child process (multiprocessing's) and the model in a
grandchild. Its own
shutdown ends them, but a core killed by a signal leaves its worker to notice on its
own, and a core that does not answer in time is only force-killed by vLLM's process
manager, never its worker. So the engine notes its descendants once loaded and, after
its shutdown, ends any of them still there: nothing it started outlives the command.
A pid is matched with its start time, so a pid reused meanwhile is never touched.
Linux only (/proc); elsewhere there is nothing to note and nothing is ended.
"""

import contextlib
import multiprocessing
import os
import signal
import time
from pathlib import Path

Started = dict[int, str]  # pid -> its start time, in clock ticks since boot


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, children first."""
    found: list[int] = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            kids = [int(c) for c in children.read_text().split()]
        except OSError:
            continue
        for kid in kids:
            found += [kid, *descendants(kid)]
    return found


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name, in parentheses, may hold spaces: count fields after it.
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] == "Z":  # a zombie has ended; its parent has yet to reap it
        return None
    return fields[19]


def note() -> Started:
    """The processes this one started with multiprocessing (vLLM's engine core) and all
    below them, with their start times. Not multiprocessing's resource tracker, which is
    no engine's and ends by itself when this process does."""
    noted: Started = {}
    for child in multiprocessing.active_children():
        if child.pid is None:
            continue
        for pid in [child.pid, *descendants(child.pid)]:
            started = _start_time(pid)
            if started is not None:
                noted[pid] = started
    return noted


def alive(noted: Started) -> list[int]:
    """The noted processes still running (not the ones whose pid was taken again)."""
    return [pid for pid, started in noted.items() if _start_time(pid) == started]


def name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def end(noted: Started, grace_s: float) -> list[str]:
    """Wait up to `grace_s` for the noted processes to end, then SIGKILL those left;
    returns those that had to be killed, as `name[pid]`."""
    deadline = time.monotonic() + grace_s
    while (left := alive(noted)) and time.monotonic() < deadline:
        time.sleep(0.05)
    killed = [f"{name(pid)}[{pid}]" for pid in left]
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return killed

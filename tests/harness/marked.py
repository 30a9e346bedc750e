"""Count the processes a test started, wherever they ended up in the process tree.

A command under test gets QUOTAFLOW_TEST_MARK=<unique> in its environment; every
process it starts inherits it (vLLM's engine core and its model worker too), even one
that leaves the command's process group or is re-parented when its parent dies. So
"every child ended" is checked by finding no process with the mark, not by walking
the tree of a parent that may be gone.
"""

import time
import uuid
from pathlib import Path

MARK_VAR = "QUOTAFLOW_TEST_MARK"


def new_mark() -> dict[str, str]:
    """An environment entry that marks a command and everything it starts."""
    return {MARK_VAR: uuid.uuid4().hex}


def marked(env: dict[str, str]) -> list[int]:
    """The live processes carrying `env`'s mark (zombies count as ended)."""
    needle = f"{MARK_VAR}={env[MARK_VAR]}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if needle not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            status = (proc / "stat").read_text()
        except OSError:  # it ended meanwhile, or is not ours to read
            continue
        if status[status.rindex(")") + 2] != "Z":
            found.append(int(proc.name))
    return found


def wait_none_marked(env: dict[str, str], timeout: float) -> list[int]:
    """Wait up to `timeout` s for every marked process to end; those still running."""
    deadline = time.monotonic() + timeout
    while (left := marked(env)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left

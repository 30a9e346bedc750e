"""Start and stop the real processes the tests need (API, workers, Flower, mock provider).

Every process is started here and ended here, by its own pid; the machine's
shared services are never touched.
"""

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def quiet_port() -> int:
    """A free port below the kernel's ephemeral range, for a server whose port is chosen
    long before it (re)starts: `free_port`'s ports come from that range, where another
    test's server or any outgoing connection may take one in the meantime."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    below = range(max(low - 12_000, 1024), low)
    for port in random.sample(below, min(200, len(below))):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


class Proc:
    """A child process with its output in a log file, shown when a test fails to start it.

    Each runs in a process group of its own; `stop` ends the whole group, and
    conftest stops any still running when the test session ends.
    """

    running: ClassVar[list["Proc"]] = []

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path,
                 cwd: Path | None = None) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("wb")
        self._start = lambda: subprocess.Popen(argv, env=env, cwd=cwd, stdout=self._log,
                                               stderr=subprocess.STDOUT, start_new_session=True)
        self.popen = self._start()
        Proc.running.append(self)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log(self, chars: int = 6000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def wait_until(self, ready: Callable[[], bool], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                code = self.popen.returncode
                raise RuntimeError(f"{self.name} exited with {code}:\n{self.log()}")
            try:
                if ready():
                    return
            except (httpx.HTTPError, OSError):
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{self.name} not ready after {timeout}s:\n{self.log()}")

    def restart_if_exited(self) -> int | None:
        """What a process manager's restart policy (compose's `unless-stopped`) does: start
        the command again if it exited, its output appended to the same log; the exit
        status it ended with, or None while it runs."""
        code = self.popen.poll()
        if code is not None:
            self.popen = self._start()
        return code

    def wait_http(self, url: str, timeout: float = 60.0, **kwargs: object) -> None:
        self.wait_until(lambda: httpx.get(url, timeout=2, **kwargs).status_code == 200, timeout)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the process group we started, wait, then SIGKILL whatever is left of it
        (a worker's pool children can outlive their parent)."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)
        self._log.close()
        if self in Proc.running:
            Proc.running.remove(self)


def quotaflow(*args: str) -> list[str]:
    """argv that runs the installed `quotaflow` entry point with this interpreter."""
    return [sys.executable, "-c", "from cli.main import main; main()", *args]

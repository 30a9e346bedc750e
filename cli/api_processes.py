"""`quotaflow api --workers N`: N uvicorn processes, each listening on the port itself.

Each process binds the port with SO_REUSEPORT, so the kernel spreads new connections over
the processes by a hash of the client's address and port. With one shared socket
(uvicorn's own `--workers`) whichever process wakes first accepts every waiting
connection, so one process can take most of a crowd while the other idles. Each socket
is made as a TCP socket (IPPROTO_TCP): asyncio sets TCP_NODELAY only on such sockets'
connections, and without it a small answer waits for the client's delayed ACK (~40 ms).

The supervisor starts, restarts and stops, nothing more. Its signal handler only records
the signal (no lock, no I/O); its loop sends SIGTERM on to each process, which drains
requests in flight for `graceful_s`, and kills what is left a few seconds later. A
process also ends when the supervisor dies (PR_SET_PDEATHSIG), leaving no orphan.
"""

import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import Any

logger = logging.getLogger("quotaflow.api")

STARTUP_FAILURE = 3  # uvicorn's exit code for an app or socket that cannot start
KILL_AFTER_S = 3.0  # past the graceful drain, what is still running is killed
PR_SET_PDEATHSIG = 1


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port beside the other processes' (not yet listening)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def _end_with_parent() -> None:
    # Not Linux: no prctl, and the supervisor's stop is the only way.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def serve_one(options: dict[str, Any], host: str, port: int) -> None:
    """One API process: its own socket on the shared port, then uvicorn until told to stop."""
    import uvicorn

    _end_with_parent()
    try:
        sock = listening_socket(host, port)
    except OSError as exc:
        logger.error("cannot listen on %s:%s: %s", host, port, exc)
        sys.exit(STARTUP_FAILURE)
    uvicorn.Server(uvicorn.Config(**options)).run(sockets=[sock])


def serve(options: dict[str, Any], host: str, port: int, count: int,
          graceful_s: float) -> int:
    """Serve the API in `count` processes (one: in this one); the command's exit status."""
    if count == 1:
        import uvicorn

        uvicorn.run(host=host, port=port, **options)
        return 0
    return Supervisor(options, host, port, count, graceful_s).run()


class Supervisor:
    """Keeps `count` API processes running until a signal, then ends them all."""

    def __init__(self, options: dict[str, Any], host: str, port: int, count: int,
                 graceful_s: float) -> None:
        self.options, self.host, self.port = options, host, port
        self.count, self.graceful_s = count, graceful_s
        self.signals: list[int] = []
        self.processes: list[BaseProcess] = []
        self.context = multiprocessing.get_context("spawn")

    def _record(self, signum: int, _frame: object) -> None:
        self.signals.append(signum)  # only this: the loop acts on it

    def _start(self) -> BaseProcess:
        process = self.context.Process(target=serve_one, name="quotaflow-api",
                                       args=(self.options, self.host, self.port))
        process.start()
        return process

    def run(self) -> int:
        """Serve until SIGINT/SIGTERM/SIGHUP; the exit status for the command."""
        listening_socket(self.host, self.port).close()  # a port in use fails here, once
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, self._record)
        self.processes = [self._start() for _ in range(self.count)]
        logger.info("API on %s:%s in %d processes %s", self.host, self.port, self.count,
                    [p.pid for p in self.processes])
        status = 0
        while not self.signals:
            wait([p.sentinel for p in self.processes], timeout=0.5)
            for index, process in enumerate(self.processes):
                if process.is_alive() or self.signals:
                    continue
                if process.exitcode == STARTUP_FAILURE:
                    logger.error("API process %s could not start; stopping", process.pid)
                    self.signals.append(signal.SIGTERM)
                    status = 1
                    break
                logger.warning("API process %s ended (exit %s); starting another",
                               process.pid, process.exitcode)
                self.processes[index] = self._start()
        self._stop()
        return status

    def _stop(self) -> None:
        """SIGTERM to each process (again for each further signal), SIGKILL at the end."""
        told = 0
        deadline = time.monotonic() + self.graceful_s + KILL_AFTER_S
        while time.monotonic() < deadline:
            if told < len(self.signals):
                told = len(self.signals)
                self._send(signal.SIGTERM)
            living = [p.sentinel for p in self.processes if p.is_alive()]
            if not living:
                return
            wait(living, timeout=0.2)
        self._send(signal.SIGKILL)
        for process in self.processes:
            process.join(2)

    def _send(self, signum: int) -> None:
        for process in self.processes:
            if process.is_alive() and process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signum)

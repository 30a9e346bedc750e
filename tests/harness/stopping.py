"""Tell a long-running command to stop, and count what is left of its process group.

The ways a command is told (SIGINT to its group, as a terminal sends Ctrl-C; SIGTERM to
its first process alone, as docker or systemd send it; either twice in a row, at gaps
from none to a few hundred ms, the second arriving while the first one's handler may
still run), the commands that must obey, and starting one until all its processes are
up. tests/cluster/test_clean_ends.py and test_clean_ends_soak.py use them.
"""

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.harness import served_by
from tests.harness.procs import Proc, free_port, quotaflow

STOP_WITHIN_S = 10.0
RUN_LINES = 3000


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


@dataclass(frozen=True)
class Command:
    """A command, when it is up (all its processes started), and the rounds it gets in
    the suite's quick pass."""

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
# webhook deliverer) are up. In the quick pass the worker with its companion, the command
# a stop once left running, gets the most rounds.
COMMANDS = [
    Command("worker", ("worker", "--concurrency", "1", "--realtime-slots", "1"), 4, 10,
            _logged(2, " ready.")),
    Command("worker-alone", ("worker", "--concurrency", "1", "--realtime-slots", "0"), 2, 3,
            _logged(1, " ready.")),
    Command("api", ("api",), 1, 2, _healthy("/healthz")),
    Command("api-2", ("api", "--workers", "2"), 4, 3, _healthy("/healthz")),
    Command("flower", ("flower", "--no-auth"), 1, 2, _healthy("/healthcheck")),
    # In the middle of a job on the embedded default (SQLite, the in-process mock held to
    # a few requests a second), once its progress line shows.
    Command("run", ("run", "in.jsonl"), 1, 2, _logged(1, f"/{RUN_LINES:,} (")),
]


def launch(command: Command, env: dict[str, str], workdir: Path, n: int) -> tuple[Proc, int]:
    """Start the command (not waiting for it); its process and its port."""
    port = free_port()
    ports = {"api": "--port", "flower": "--port"}
    verb = command.args[0]
    args = [*command.args, ports[verb], str(port)] if verb in ports else [*command.args]
    if verb == "worker":
        args += ["--name", f"ends-{command.name}-{n}@qftest"]
    if verb == "run":
        args += ["-o", f"out-{n}.jsonl"]
        env = {**env, **_run_files(workdir, n)}
    return Proc(f"{command.name}-{n}", quotaflow(*args), env, workdir, cwd=workdir), port


def _run_files(workdir: Path, n: int) -> dict[str, str]:
    """The input and deployments file of a `run` (written once per folder), and the
    environment that names them with a database of the round's own."""
    deployments = workdir / "slow.toml"
    if not deployments.exists():
        deployments.write_text('[deployments.slow]\nprovider = "mock"\nmodel = "m"\n'
                               'rpm = 60\ntpm = 100000\n[routes]\n"*" = "slow"\n')
        (workdir / "in.jsonl").write_text("".join(
            json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                        "body": {"model": "m", "max_tokens": 5,
                                 "messages": [{"role": "user", "content": f"hi {i}"}]}}) + "\n"
            for i in range(RUN_LINES)))
    return {"QUOTAFLOW_DATABASE_URL": f"sqlite:///{workdir / f'run-{n}.db'}",
            "QUOTAFLOW_DEPLOYMENTS_FILE": str(deployments)}


def wait_up(command: Command, proc: Proc, port: int) -> None:
    proc.wait_until(lambda: command.up(proc, port) and
                    len(served_by.group(proc.pid)) >= command.processes, timeout=120)


def left_after(procs: list[Proc], began: float) -> dict[Proc, list[str]]:
    """Wait until every group is gone or STOP_WITHIN_S has passed since `began`; what is
    left of each group then (the command line of each process)."""
    left = {proc: served_by.group(proc.pid) for proc in procs}
    while any(left.values()) and time.monotonic() - began < STOP_WITHIN_S:
        for proc in procs:
            proc.popen.poll()  # each leader reaped as soon as it ends
        time.sleep(0.05)
        left = {proc: served_by.group(proc.pid) for proc in procs}
    return {proc: [cmdline(pid) for pid in pids] for proc, pids in left.items() if pids}


def cmdline(pid: int) -> str:
    try:
        return f"{pid} " + Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")[:160]
    except OSError:
        return str(pid)

"""How a local model's commands end: `quotaflow run` to its job's end or Ctrl-C'd mid-job,
and `quotaflow worker --deployment` stopped with SIGTERM; the same checks for every
engine (tests/cluster/test_local_ends.py on transformers, test_vllm_ends.py on vLLM).

Each command runs in a session of its own with a mark in its environment
(tests/harness/marked.py): its processes are counted before, while and after it runs.
"""

import os
import signal
import sqlite3
import subprocess
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from tests.harness.factories import chat_line, write_jsonl
from tests.harness.marked import marked, new_mark, wait_none_marked
from tests.harness.procs import quotaflow

# The bound: every command ends within this of its job's end, or of a signal.
ENDS_WITHIN_S = 10.0


@dataclass
class Ended:
    returncode: int
    stderr: str
    after_s: float  # from the job's end (or the signal) to the command's exit
    most_processes: int  # the most marked processes seen while it ran
    left: list[int]  # marked processes still running ENDS_WITHIN_S after the exit


def chat_lines(count: int, max_tokens: int, model: str = "tiny") -> list[dict]:
    return [chat_line(f"c{i}", f"question {i} about the tide", model=model,
                      max_tokens=max_tokens) for i in range(count)]


def write_input(path: Path, lines: list[dict | str]) -> Path:
    return write_jsonl(path, lines)


def run_env(base: dict[str, str], workdir: Path) -> dict[str, str]:
    """An embedded run's environment: its own SQLite file, and the mark."""
    return {**base, "QUOTAFLOW_DATABASE_URL": f"sqlite:///{workdir / 'embedded.db'}",
            **new_mark()}


def start_run(python: str, env: dict[str, str], workdir: Path, input_name: str,
              log: Path) -> subprocess.Popen:
    argv = [python, *quotaflow("run", input_name, "-o", "out.jsonl", "--json")[1:]]
    with log.open("wb") as err, (workdir / "job.json").open("wb") as out:
        return subprocess.Popen(argv, cwd=workdir, env=env, stdout=out, stderr=err,
                                start_new_session=True)


def _watch(popen: subprocess.Popen, env: dict[str, str], timeout: float) -> int:
    """Wait for the command to exit, counting its marked processes; the most seen."""
    most = 0
    deadline = time.monotonic() + timeout
    while popen.poll() is None:
        most = max(most, len(marked(env)))
        if time.monotonic() > deadline:
            os.killpg(popen.pid, signal.SIGKILL)
            raise TimeoutError(f"still running after {timeout} s")
        time.sleep(0.2)
    return most


def job_end(workdir: Path) -> float | None:
    """When the embedded run's job ended (completed_at, UTC), as a Unix time."""
    with sqlite3.connect(workdir / "embedded.db", timeout=10) as db:
        (ended,) = db.execute("SELECT completed_at FROM jobs").fetchone()
    if ended is None:
        return None
    return datetime.fromisoformat(ended).replace(tzinfo=UTC).timestamp()


def item_counts(workdir: Path) -> dict[str, int]:
    with sqlite3.connect(workdir / "embedded.db", timeout=10) as db:
        return dict(db.execute("SELECT status, count(*) FROM items GROUP BY status"))


def job_status(workdir: Path) -> str:
    with sqlite3.connect(workdir / "embedded.db", timeout=10) as db:
        (status,) = db.execute("SELECT status FROM jobs").fetchone()
    return status


def run_to_end(python: str, env: dict[str, str], workdir: Path, input_name: str,
               timeout: float = 300) -> Ended:
    log = workdir / "run.log"
    popen = start_run(python, env, workdir, input_name, log)
    most = _watch(popen, env, timeout)
    exited = time.time()
    ended = job_end(workdir)
    assert ended is not None, log.read_text(errors="replace")[-6000:]
    return Ended(popen.returncode, log.read_text(errors="replace"), exited - ended, most,
                 wait_none_marked(env, ENDS_WITHIN_S))


def interrupt_run(python: str, env: dict[str, str], workdir: Path, input_name: str,
                  after_done: int, timeout: float = 300) -> Ended:
    """Start the run, and Ctrl-C it (SIGINT to its process group, as a terminal sends it)
    once `after_done` lines have succeeded."""
    log = workdir / "run.log"
    popen = start_run(python, env, workdir, input_name, log)
    most = 0
    deadline = time.monotonic() + timeout
    while True:
        assert popen.poll() is None, log.read_text(errors="replace")[-6000:]
        assert time.monotonic() < deadline, log.read_text(errors="replace")[-6000:]
        most = max(most, len(marked(env)))
        try:
            if item_counts(workdir).get("succeeded", 0) >= after_done:
                break
        except sqlite3.OperationalError:  # not made yet, or busy
            pass
        time.sleep(0.1)
    os.killpg(popen.pid, signal.SIGINT)
    asked = time.time()
    try:
        popen.wait(ENDS_WITHIN_S * 3)
    except subprocess.TimeoutExpired:
        os.killpg(popen.pid, signal.SIGKILL)
        popen.wait()
    exited = time.time()
    return Ended(popen.returncode, log.read_text(errors="replace"), exited - asked, most,
                 wait_none_marked(env, ENDS_WITHIN_S))

"""The progress every long-running command shows: done/total, rate and ETA.

On a terminal, rich's bar redrawn in place. Anywhere else (CI logs, `| tee`, `nohup`) a
redrawn bar becomes fragments ("757,... eta 0:00..."), so a plain line is written every
QUOTAFLOW_PROGRESS_INTERVAL_S seconds instead, and one at the end; `--quiet` shows none.
All three take the calls the commands make: add_task, update, advance, as a context.
"""

import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import IO, Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

stderr = Console(stderr=True)


class RateColumn(ProgressColumn):
    """Requests per second (or the task's own `unit`: lines), as rich measures its speed."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        unit = task.fields.get("unit", "req")
        return Text(f"-- {unit}/s" if speed is None else f"{speed:,.1f} {unit}/s",
                    style="cyan")


def bar_progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        RateColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        TextColumn("elapsed"),
        TimeElapsedColumn(),
        console=stderr,
    )


def eta_text(seconds: float) -> str:
    """0:42, 12:05, 3:04:05: short enough for a log line."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class LineProgress:
    """One plain line per interval: 'JOB running: 757/2,000 (37.9%), 12.3 req/s, eta 1:41'.

    The rate is the average since the task began (what a log reader compares between
    lines); the ETA is what is left at that rate. The clock is a parameter so the unit
    tests need not sleep."""

    def __init__(self, out: IO[str], interval_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._out, self._interval, self._clock = out, interval_s, clock
        self._tasks: dict[TaskID, dict[str, Any]] = {}

    def __enter__(self) -> "LineProgress":
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for task_id, task in self._tasks.items():
            if task["line"] != self.line(task_id):  # the last state, unless just written
                self._write(task_id)

    def add_task(self, description: str, total: float | None = None,
                 unit: str = "req") -> TaskID:
        task_id = TaskID(len(self._tasks))
        now = self._clock()
        self._tasks[task_id] = {"description": description, "total": total, "done": 0.0,
                                "started": now, "written": now, "line": None, "unit": unit}
        return task_id

    def update(self, task_id: TaskID, completed: float | None = None,
               description: str | None = None, total: float | None = None) -> None:
        task = self._tasks[task_id]
        if completed is not None:
            task["done"] = completed
        if description is not None:
            task["description"] = description
        if total is not None:
            task["total"] = total
        if self._clock() - task["written"] >= self._interval:
            self._write(task_id)

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        self.update(task_id, completed=self._tasks[task_id]["done"] + advance)

    def line(self, task_id: TaskID) -> str:
        task = self._tasks[task_id]
        done, total = int(task["done"]), task["total"]
        elapsed = self._clock() - task["started"]
        rate = done / elapsed if elapsed > 0 else 0.0
        text = f"{task['description']}: {done:,}"
        if total:
            text += f"/{int(total):,} ({done / total:.1%})"
        text += f", {rate:,.1f} {task['unit']}/s"
        if total and done >= total:
            text += f", done in {eta_text(elapsed)}"
        elif total and rate > 0:
            text += f", eta {eta_text((total - done) / rate)}"
        else:
            text += ", eta --"
        return text

    def _write(self, task_id: TaskID) -> None:
        task = self._tasks[task_id]
        task["written"], task["line"] = self._clock(), self.line(task_id)
        self._out.write(task["line"] + "\n")
        self._out.flush()


class NoProgress(LineProgress):
    """`--quiet`: the same calls, nothing written."""

    def __init__(self) -> None:
        super().__init__(sys.stderr, float("inf"))

    def _write(self, task_id: TaskID) -> None:
        pass


def request_progress(quiet: bool = False) -> Progress | LineProgress:
    """The bar on a terminal, plain lines elsewhere, nothing with --quiet."""
    if quiet:
        return NoProgress()
    if stderr.is_terminal:
        return bar_progress()
    from quotaflow.config import get_settings

    return LineProgress(sys.stderr, get_settings().progress_interval_s)

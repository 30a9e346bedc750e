"""The progress bar every long-running command shows: done/total, rate and ETA."""

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

stderr = Console(stderr=True)


class RateColumn(ProgressColumn):
    """Requests per second, as rich measures the task's speed."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("-- req/s" if speed is None else f"{speed:,.1f} req/s", style="cyan")


def request_progress() -> Progress:
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

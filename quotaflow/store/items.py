"""What the store hands a worker and what it takes from one: a claimed item, a batch's
range of lines.

Here, below every room that runs items, so that the stores (postgres.py, sqlite.py)
build the claimed items themselves and the rooms above share the one shape.
"""

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(slots=True)
class ClaimedItem:
    """A claimed item as the worker runs it. Not frozen, as ProviderResponse (one per
    request, and a frozen dataclass costs four times as much to build)."""

    line_no: int
    custom_id: str | None
    body: dict[str, Any]
    attempts: int
    body_hash: str | None = None
    route: str | None = None  # its route's name, decided at ingest


class LineRange(Protocol):
    """A batch's lines of one job, first to last inclusive (dispatch.queues.BatchRef)."""

    @property
    def job_id(self) -> str: ...

    @property
    def first_line(self) -> int: ...

    @property
    def last_line(self) -> int: ...

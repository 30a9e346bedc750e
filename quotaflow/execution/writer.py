"""Results leave a batch a chunk at a time: one transaction per chunk, not per answer.

A round trip per result would cost a worker more than its calls. Answers wait here a few
tens of milliseconds at most (or until the batch ends) and go to PostgreSQL
together; a write that fails keeps its chunk for the next try, so an answer
the provider already gave is not thrown away because the database blinked.
"""

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy.orm import Session, sessionmaker

from quotaflow.providers.outcomes import Outcome, Provenance
from quotaflow.results.leases import ClaimedItem, OnStored, store_many

# Write once this many answers wait, or once the oldest has waited this long. The time
# bounds what a killed worker loses on a slow provider; the size, on an instant one,
# how many answers share a chunk's transaction (docs/benchmarks.md compares sizes).
FLUSH_SIZE = 256
FLUSH_AFTER_S = 0.1


@dataclass
class ResultWriter:
    """One batch run's outcomes on their way to the database, and its tallies."""

    sessions: sessionmaker[Session]
    job_id: str
    on_item: Callable[[bool], None] | None = None
    # Whether identical requests of the job wait for these answers (shared on store).
    share: bool = True
    # Given the answered calls of each chunk in the transaction storing it: the run's
    # hooks' `before_store` (hooks.py; the spend hook bills them there).
    on_stored: OnStored | None = None
    succeeded: int = 0
    failed: int = 0
    _buffer: list[tuple[ClaimedItem, Outcome]] = field(default_factory=list)
    _provenance: list[Provenance | None] = field(default_factory=list)  # one per entry
    _since: float = 0.0
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Rung when a write falls due by its size, or when the first answer starts the
    # clock: the batch's flusher (flushing.py) sleeps on it, not on a tick.
    bell: asyncio.Event | None = None

    def add(self, item: ClaimedItem, outcome: Outcome,
            provenance: Provenance | None = None) -> None:
        buffer = self._buffer
        if not buffer:
            self._since = time.monotonic()
        buffer.append((item, outcome))
        self._provenance.append(provenance)
        if self.bell is not None and (len(buffer) == 1 or len(buffer) == FLUSH_SIZE):
            self.bell.set()

    @property
    def waiting(self) -> int:
        return len(self._buffer)

    def due_at(self) -> float | None:
        """When the answers waiting are to be written (time.monotonic()); None: none wait."""
        if not self._buffer:
            return None
        return self._since if len(self._buffer) >= FLUSH_SIZE else self._since + FLUSH_AFTER_S

    def due(self) -> bool:
        due_at = self.due_at()
        return due_at is not None and due_at <= time.monotonic()

    async def flush(self) -> None:
        """Write what waits, in a thread so the loop goes on receiving answers meanwhile."""
        async with self._lock:
            if not self._buffer:
                return
            chunk, self._buffer = self._buffer, []
            provenance, self._provenance = self._provenance, []
            try:
                succeeded, failed = await asyncio.to_thread(
                    store_many, self.sessions, self.job_id, chunk, self.share, provenance,
                    self.on_stored)
            except BaseException:
                self._buffer[:0] = chunk
                self._provenance[:0] = provenance
                raise
        self.succeeded += succeeded
        self.failed += failed
        if self.on_item is not None:
            for ok in (True,) * succeeded + (False,) * failed:
                self.on_item(ok)

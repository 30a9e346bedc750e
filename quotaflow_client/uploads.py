"""What an upload tells while it goes: the lines of a file sent so far."""

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO


class Counted:
    """A file sent as a body, telling `on_sent` how many lines have gone each time a
    piece is read (from 0 again when a retry sends it anew). Its fileno gives httpx the
    length, so the body keeps its Content-Length."""

    def __init__(self, handle: IO[bytes], on_sent: Callable[[int], None]) -> None:
        self._handle, self._on_sent, self._lines = handle, on_sent, 0
        on_sent(0)

    def fileno(self) -> int:
        return self._handle.fileno()

    def read(self, size: int = -1) -> bytes:
        piece = self._handle.read(size)
        self._lines += piece.count(b"\n")
        self._on_sent(self._lines)
        return piece

    def __iter__(self) -> Iterator[bytes]:
        while piece := self.read(64 * 1024):
            yield piece


def count_lines(path: Path) -> int:
    """Lines in a file, read a MiB at a time: the total a submit's progress shows."""
    count = 0
    with path.open("rb") as handle:
        while piece := handle.read(1 << 20):
            count += piece.count(b"\n")
    return count

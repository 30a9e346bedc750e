"""A download's pieces read ahead on a thread of their own (quotaflow/results/read_ahead.py)."""

import threading
import time
from collections.abc import Iterator

import pytest

from quotaflow.results.read_ahead import read_ahead


def test_pieces_come_in_order_and_are_made_ahead_of_the_reader() -> None:
    made: list[int] = []

    def pieces() -> Iterator[bytes]:
        for n in range(6):
            made.append(n)
            yield str(n).encode()

    reader = read_ahead(pieces, depth=2)
    assert next(reader) == b"0"
    deadline = time.monotonic() + 5
    while len(made) < 4 and time.monotonic() < deadline:  # one sent, two queued, one held
        time.sleep(0.01)
    assert made == [0, 1, 2, 3]  # made while the first was being sent, no further
    assert list(reader) == [b"1", b"2", b"3", b"4", b"5"]


def test_a_failure_while_making_pieces_reaches_the_reader() -> None:
    def pieces() -> Iterator[bytes]:
        yield b"a"
        raise RuntimeError("the database went away")

    reader = read_ahead(pieces)
    assert next(reader) == b"a"
    with pytest.raises(RuntimeError, match="went away"):
        next(reader)


def test_a_reader_that_stops_early_stops_the_thread_and_closes_the_source() -> None:
    closed = threading.Event()

    def pieces() -> Iterator[bytes]:
        try:
            n = 0
            while True:
                n += 1
                yield b"x" * n
        finally:
            closed.set()

    reader = read_ahead(pieces, depth=1)
    assert next(reader) == b"x"
    reader.close()  # the client went away
    assert closed.wait(5), "the source was not closed"
    time.sleep(0.1)
    assert not [t for t in threading.enumerate() if t.name == "quotaflow-read-ahead"]

"""A download's pieces made ahead on threads of their own (quotaflow/results/read_ahead.py)."""

import contextlib
import itertools
import threading
import time
from collections.abc import Iterator

import pytest

from quotaflow.results.read_ahead import made_in_parallel, read_ahead


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


class _Resource:
    """A resource per thread (a session in the API), counting opens and closes."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def __enter__(self) -> "_Resource":
        self.log.append("open")
        return self

    def __exit__(self, *exc: object) -> None:
        self.log.append("close")


def test_pieces_made_on_several_threads_come_in_order_with_gaps_skipped() -> None:
    log: list[str] = []
    threads: set[str] = set()

    def make(resource: _Resource, n: int) -> bytes | None:
        threads.add(threading.current_thread().name + str(id(resource)))
        time.sleep(0.02 if n % 3 == 0 else 0.001)  # out of order if not put back in order
        return None if n == 4 else str(n).encode()

    pieces = list(made_in_parallel(range(12), make, lambda: _Resource(log), workers=3))
    assert pieces == [str(n).encode() for n in range(12) if n != 4]
    assert log.count("open") == 3 and log.count("close") == 3
    assert len(threads) == 3  # each thread made pieces with its own resource


def test_no_piece_is_made_depth_or_more_ahead_of_the_reader() -> None:
    made: list[int] = []

    def make(resource: object, n: int) -> bytes:
        made.append(n)
        return str(n).encode()

    reader = made_in_parallel(range(20), make, contextlib.nullcontext, workers=2, depth=3)
    assert next(reader) == b"0"
    time.sleep(0.2)
    assert max(made) <= 3  # read 0: the next wanted is 1, so at most 1, 2, 3
    assert list(reader) == [str(n).encode() for n in range(1, 20)]


def test_a_failed_piece_reaches_the_reader_and_stops_the_threads() -> None:
    def make(resource: object, n: int) -> bytes:
        if n == 2:
            raise RuntimeError("the database went away")
        return b"ok"

    reader = made_in_parallel(range(1000), make, contextlib.nullcontext, workers=2)
    assert next(reader) == b"ok" and next(reader) == b"ok"
    with pytest.raises(RuntimeError, match="went away"):
        next(reader)
    time.sleep(0.2)
    assert not [t for t in threading.enumerate() if t.name == "quotaflow-read-ahead"]


def test_a_reader_that_stops_early_stops_the_threads_and_closes_their_resources() -> None:
    log: list[str] = []
    reader = made_in_parallel(itertools.count(), lambda resource, n: b"x",
                              lambda: _Resource(log), workers=2)
    assert next(reader) == b"x"
    reader.close()  # the client went away
    deadline = time.monotonic() + 5
    while log.count("close") < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert log.count("close") == 2


def test_a_resource_that_cannot_be_opened_fails_the_download() -> None:
    def broken() -> _Resource:
        raise OSError("connection refused")

    with pytest.raises(OSError, match="refused"):
        list(made_in_parallel(range(5), lambda resource, n: b"x", broken, workers=2))

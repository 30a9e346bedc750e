"""A download's next pieces made while the current one is sent.

A download is a chain: PostgreSQL writes a piece of lines (output_pieces.py), the API
sends it, the client writes it. Pulled one piece at a time, the database sat idle while
a piece was on its way and the network while the next was made. Here the pieces are
made on threads of their own, ahead of the one being sent, so the links overlap on a
machine's cores: `read_ahead` runs one iterator on one thread; `made_in_parallel`
makes independent pieces on several connections at once (one PostgreSQL connection
renders at most one core's worth of lines).
"""

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_END = object()
_PUT_TIMEOUT_S = 0.5  # how often a producer with a full queue looks whether to stop


def read_ahead(make: Callable[[], Iterator[bytes]], depth: int = 2) -> Iterator[bytes]:
    """What `make()` yields, in order, made on a thread of its own. Closing this
    iterator early (a client gone) stops the thread and closes `make()`'s iterator
    there, where it was opened (its session with it)."""
    pieces: queue.Queue[object] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def hand_over(item: object) -> bool:
        while not stop.is_set():
            try:
                pieces.put(item, timeout=_PUT_TIMEOUT_S)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        made = make()
        try:
            for piece in made:
                if not hand_over(piece):
                    return
            hand_over(_END)
        except BaseException as exc:  # re-raised where the pieces are read
            hand_over(exc)
        finally:
            close = getattr(made, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, daemon=True, name="quotaflow-read-ahead")
    thread.start()
    try:
        while (item := pieces.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield item  # type: ignore[misc]  # a piece: _END and failures are out
    finally:
        stop.set()


class _Board(Generic[T]):
    """Where the threads of made_in_parallel take tasks and leave pieces, in order."""

    _FAILED = -1  # the key of a thread's failure to open its resource

    def __init__(self, tasks: Iterable[T], depth: int, workers: int) -> None:
        self._todo = enumerate(tasks)
        self._done: dict[int, object] = {}
        self._state = threading.Condition()
        self._depth = depth
        self._running = workers
        self.next = 0  # index of the piece the reader wants
        self.stopped = False

    def take(self) -> tuple[int, T] | None:
        """The next task, once the reader is less than depth behind it; None at the end."""
        with self._state:
            taken = None if self.stopped else next(self._todo, None)
            while taken is not None and not self.stopped and taken[0] >= self.next + self._depth:
                self._state.wait()
            return None if self.stopped else taken

    def leave(self, index: int, piece: object) -> None:
        with self._state:
            self._done[index] = piece
            self._state.notify_all()

    def quit(self) -> None:
        """A thread is done (the tasks ran out, or the reader stopped)."""
        with self._state:
            self._running -= 1
            self._state.notify_all()

    def pick(self) -> object:
        """The reader's next piece (an exception to raise, None to skip); _END at the end."""
        with self._state:
            while (self.next not in self._done and self._FAILED not in self._done
                   and self._running):
                self._state.wait()
            if self.next in self._done:
                piece = self._done.pop(self.next)
            elif self._FAILED in self._done:
                piece = self._done.pop(self._FAILED)
            else:
                return _END
            self.next += 1
            self._state.notify_all()
            return piece

    def stop(self) -> None:
        with self._state:
            self.stopped = True
            self._state.notify_all()


def made_in_parallel(tasks: Iterable[T], make: Callable[[R, T], bytes | None],
                     opener: Callable[[], AbstractContextManager[R]], workers: int = 2,
                     depth: int = 4) -> Iterator[bytes]:
    """`make(resource, task)` for each task, yielded in the tasks' order (None skipped),
    made by `workers` threads at once, each with a resource of its own (a database
    session: one connection renders one piece at a time, so it makes at most one core's
    worth). No thread takes a task `depth` or more ahead of the reader, so memory holds
    at most depth pieces. Closing this iterator early stops the threads."""
    board = _Board(tasks, depth, workers)

    def work() -> None:
        try:
            with opener() as resource:
                while (taken := board.take()) is not None:
                    try:
                        piece: object = make(resource, taken[1])
                    except BaseException as exc:  # re-raised where the pieces are read
                        piece = exc
                    board.leave(taken[0], piece)
        except BaseException as exc:  # the resource could not be opened (or closed)
            board.leave(_Board._FAILED, exc)
        finally:
            board.quit()

    for _ in range(workers):
        threading.Thread(target=work, daemon=True, name="quotaflow-read-ahead").start()
    try:
        while (piece := board.pick()) is not _END:
            if isinstance(piece, BaseException):
                raise piece
            if piece is not None:
                yield piece  # type: ignore[misc]  # a piece: _END and failures are out
    finally:
        board.stop()

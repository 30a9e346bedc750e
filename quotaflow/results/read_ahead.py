"""A download's next piece read while the current one is sent.

A download is a chain: PostgreSQL writes a piece of lines (output_pieces.py), the API
sends it, the client writes it. Pulled one piece at a time, the database sat idle while
a piece was on its way and the network while the next was made. Here the pieces are
made on a thread of their own, up to `depth` ahead of the one being sent, so the
two overlap on a machine's two cores; memory holds at most depth + 1 pieces.
"""

import queue
import threading
from collections.abc import Callable, Iterator

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
            yield item  # type: ignore[misc]
    finally:
        stop.set()

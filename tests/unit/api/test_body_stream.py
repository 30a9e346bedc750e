"""A request body read by a worker thread while it arrives (api/body_stream.py): every
byte in order through a bounded queue, whatever the reader's pace, and the receiving
side never left waiting once the reader stops."""

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from api.body_stream import QUEUED_CHUNKS, BodyReader, read_while_receiving

PIECES = 12 * QUEUED_CHUNKS


async def _pieces(count: int, sent: list[int]) -> AsyncIterator[bytes]:
    for n in range(count):
        sent.append(n)
        yield b"%06d\n" % n
        if n % 50 == 0:
            await asyncio.sleep(0)


@pytest.mark.parametrize("pause_s", [0.0, 0.002])
def test_every_piece_arrives_in_order_through_a_bounded_queue(pause_s: float) -> None:
    """A reader slower than the sender (or as fast): the sender waits while the queue is
    full and goes on as the reader makes room; nothing is lost, reordered or held beyond
    the bound."""
    sent: list[int] = []
    most_waiting: list[int] = [0]

    def work(reader: BodyReader) -> bytes:
        got = []
        while True:
            most_waiting[0] = max(most_waiting[0], reader._chunks.qsize())
            if not (data := reader.read(16 * 7)):
                break
            got.append(data)
            if pause_s:
                time.sleep(pause_s)
        return b"".join(got)

    started = time.monotonic()
    data = asyncio.run(read_while_receiving(_pieces(PIECES, sent), work))
    # The sender moves as the reader makes room, not at its half-second looks.
    assert time.monotonic() - started < 1.0
    assert data == b"".join(b"%06d\n" % n for n in range(PIECES))
    assert most_waiting[0] <= QUEUED_CHUNKS
    if pause_s:
        assert most_waiting[0] == QUEUED_CHUNKS  # the sender did wait on a full queue


def test_a_reader_that_stops_early_releases_the_sender() -> None:
    """The work ends (here, by raising) with the queue full and the sender waiting: the
    sender stops, and the error is the work's."""
    sent: list[int] = []

    def work(reader: BodyReader) -> None:
        while reader._chunks.qsize() < QUEUED_CHUNKS:
            time.sleep(0.01)
        reader.read(7)
        raise ValueError("line 3: not JSON")

    started = time.monotonic()
    with pytest.raises(ValueError, match="line 3"):
        asyncio.run(read_while_receiving(_pieces(PIECES, sent), work))
    assert time.monotonic() - started < 2.5
    assert len(sent) < PIECES  # it stopped receiving: the rest was never asked for

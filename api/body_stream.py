"""A request body read by a worker thread while it arrives.

POST /jobs takes the file as a multipart form, which Starlette spools whole before the
route runs: a large upload is received, then read again, one after the other.
POST /jobs/jsonl takes the file as the body itself, and ingest reads its lines as they
come in (`BodyReader.read` in the ingest thread, `BodyReader.receive` on the event
loop), so receiving the upload and storing its lines overlap.

What was read is also kept in a spooled temporary file (a disk file past 1 MiB), so a
refused file can be read again to name both lines of a duplicate custom_id. A client
that goes away before the end of its body is an error to the reader, never the end of
the file: the job is rolled back, not stored short.
"""

import queue
import tempfile
from collections.abc import AsyncIterator, Callable
from typing import IO, TypeVar

import anyio
from starlette.requests import ClientDisconnect

T = TypeVar("T")
QUEUED_CHUNKS = 64  # pieces received and not yet read: a few MiB at most
_END = b""


class BodyReader:
    """A read-only, forward-only binary stream over the chunks `receive` hands in."""

    def __init__(self) -> None:
        self._chunks: queue.Queue[bytes | BaseException] = queue.Queue(maxsize=QUEUED_CHUNKS)
        self._ended = False  # the reader saw the end, or an error
        self._closed = False  # nobody reads any more: `receive` stops
        self._broken: BaseException | None = None  # `receive` ended before the body did
        self.kept: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=1024 * 1024)  # noqa: SIM115

    # The ingest thread's side.
    def read(self, size: int = -1) -> bytes:
        """At least one received chunk (and those already waiting, up to about `size`
        bytes); b"" at the end of the body. Raises what stopped the body early."""
        if self._ended:
            return _END
        pieces: list[bytes] = []
        got = 0
        item = self._next()
        while True:
            if isinstance(item, BaseException):
                self._ended = True
                raise item
            if item is _END:
                self._ended = True
                break
            pieces.append(item)
            got += len(item)
            if 0 <= size <= got:
                break
            try:
                item = self._chunks.get_nowait()
            except queue.Empty:
                break
        data = b"".join(pieces)
        self.kept.write(data)
        return data

    def _next(self) -> bytes | BaseException:
        """The next item `receive` handed in; what stopped it, if it stopped without one
        (its task cancelled, say, while the server shuts down)."""
        while True:
            try:
                return self._chunks.get(timeout=0.5)
            except queue.Empty:
                if self._broken is not None:
                    return self._broken

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def reread(self) -> IO[bytes]:
        """Everything read so far, from its start (for naming a refused file's lines)."""
        self.kept.seek(0)
        return self.kept

    def close(self) -> None:
        """Stop receiving: whatever waits is dropped, so `receive` never blocks on it."""
        self._closed = True
        while True:
            try:
                self._chunks.get_nowait()
            except queue.Empty:
                break
        self.kept.close()

    # The event loop's side.
    async def receive(self, chunks: AsyncIterator[bytes]) -> None:
        """Hand each chunk of the body to the reader, then its end; or the error that
        ended it (a client that disconnected)."""
        ended = False
        broken: BaseException = ClientDisconnect("the client went away before the end of "
                                                 "the file; nothing of it was stored")
        try:
            async for chunk in chunks:
                if self._closed:
                    return
                if chunk:
                    await self._put(chunk)
            await self._put(_END)
            ended = True
        except ClientDisconnect:
            pass
        except Exception as exc:  # the route's body limit (413): the reader raises it
            broken = exc
        finally:
            if not ended:
                self._broken = broken

    async def _put(self, item: bytes | BaseException) -> None:
        try:
            self._chunks.put_nowait(item)
        except queue.Full:  # the reader is behind: wait in a thread, not on the loop
            while not self._closed:
                try:
                    await anyio.to_thread.run_sync(_put_within, self._chunks, item)
                    return
                except queue.Full:
                    continue


def _put_within(chunks: queue.Queue[bytes | BaseException], item: bytes | BaseException) -> None:
    chunks.put(item, timeout=0.5)  # raises queue.Full: the caller checks whether to go on


async def read_while_receiving(chunks: AsyncIterator[bytes],
                               work: Callable[[BodyReader], T]) -> T:
    """`work(reader)` in a worker thread while the body arrives; its result, or its error.
    The body stops being received when the work ends, however it ends."""
    reader = BodyReader()
    failed: Exception | None = None
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(reader.receive, chunks)
            try:
                result = await anyio.to_thread.run_sync(work, reader)
            except Exception as exc:  # raised as it is, not inside the group's ExceptionGroup
                failed = exc
            finally:
                reader.close()
                group.cancel_scope.cancel()
    finally:
        reader.close()
    if failed is not None:
        raise failed
    return result

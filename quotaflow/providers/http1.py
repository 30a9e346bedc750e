"""A lean HTTP/1.1 client for the hot path: POST a body, get the status, headers and bytes.

On an instant provider aiohttp's request machinery (request and response objects,
payload registry, timer contexts, stream readers) cost about 0.13 ms of CPU per
call, more than everything else a worker does for the request; the bench's raw
asyncio client spends 0.05 ms. This is that raw client made fit for real
providers: keep-alive connections pooled per endpoint (most recently used first,
closed ones skipped), TLS for https, Content-Length and chunked answers, a total
timeout per call, and each answer parsed by a small protocol object rather than
a stream reader. It does only what providers need: no redirects, no cookies, no
proxies, no compression (none is asked for). A connection idle for IDLE_EXPIRY_S is
closed, not reused, so that a request never races the server's keep-alive close.
The calls' timeouts share one timer per pool, set for the earliest deadline in
flight: a timer per call (made, then cancelled, and left in the loop's heap until it
is swept) was a visible share of a worker's time against a fast provider.

Failures are plain exceptions (OSError, TimeoutError, Http1Error); the provider
turns them into quotaflow's retryable errors at its edge.
"""

import asyncio
import ssl
from dataclasses import dataclass
from urllib.parse import urlsplit

# A connection idle this long is closed rather than reused. Servers close idle keep-alive
# connections on a timer (uvicorn and Node after 5 s, nginx after 75 s); a request written
# as that timer fires meets a closed connection, fails without an answer, and costs its
# admission's budget (the provider may have counted it) and a retry. Reused only well
# inside the shortest common timeout, a connection never races its server's close.
IDLE_EXPIRY_S = 4.0
# Informational answers (100 Continue, 103 Early Hints) precede the real one; these
# statuses never carry a body.
_NO_BODY = frozenset({204, 304})


class Http1Error(Exception):
    """The server's answer was not HTTP/1.x the client can read, or it hung up mid-answer."""


@dataclass(slots=True)
class Http1Response:
    """An answer as read (not frozen: one is made per call, and a frozen dataclass sets
    each field through object.__setattr__)."""

    status: int
    reason: str
    headers: dict[str, str]  # names lower-cased; the last of a repeated header wins
    body: bytes


class _Connection(asyncio.Protocol):
    """One keep-alive connection; parses an answer as its bytes arrive."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._buffer = bytearray()
        self._waiter: asyncio.Future[Http1Response] | None = None
        self._reusable = True
        self.idle_since = 0.0  # the loop's time its last answer came in

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream's: a Transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._settle(eof=True, error=exc)

    def eof_received(self) -> bool:
        self.closed = True
        self._settle(eof=True)
        return False

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._waiter is not None:
            self._settle()

    def request(self, payload: bytes) -> "asyncio.Future[Http1Response]":
        assert self.transport is not None
        self._buffer.clear()
        self._waiter = asyncio.get_running_loop().create_future()
        self.transport.write(payload)
        return self._waiter

    @property
    def reusable(self) -> bool:
        return self._reusable and not self.closed and self._waiter is None

    def abort(self) -> None:
        self.closed = True
        self._waiter = None
        if self.transport is not None:
            self.transport.abort()

    def _settle(self, eof: bool = False, error: Exception | None = None) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        try:
            response = _parse(self._buffer, eof)
        except Http1Error as exc:
            self._fail(waiter, exc)
            return
        if response is None:
            if eof:
                self._fail(waiter, error or Http1Error("connection closed before the answer"))
            return
        answer, keep = response
        self._waiter = None
        self._reusable = keep and not eof
        waiter.set_result(answer)

    def _fail(self, waiter: "asyncio.Future[Http1Response]", exc: Exception) -> None:
        self._waiter = None
        self._reusable = False
        waiter.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()


def _parse(buffer: bytearray, eof: bool) -> tuple[Http1Response, bool] | None:
    """The complete answer at the buffer's start and whether the connection may be
    reused; None while bytes are missing."""
    start = 0
    while True:
        end = buffer.find(b"\r\n\r\n", start)
        if end < 0:
            return None
        lines = bytes(buffer[start:end]).split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        code, _, reason = rest.partition(b" ")
        if not version.startswith(b"HTTP/1.") or not code.isdigit():
            raise Http1Error(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
        status = int(code)
        if 100 <= status < 200:
            start = end + 4
            continue
        break
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    keep = version == b"HTTP/1.1" and headers.get("connection", "").lower() != "close"
    begin = end + 4
    if status in _NO_BODY:
        body: bytes | None = b""
    elif "chunked" in headers.get("transfer-encoding", "").lower():
        body = _chunked(buffer, begin)
    elif (length := headers.get("content-length")) is not None:
        if not length.isdigit():
            raise Http1Error(f"bad Content-Length {length[:40]!r}")
        size = int(length)
        body = bytes(buffer[begin:begin + size]) if len(buffer) - begin >= size else None
    else:  # the body runs until the server closes the connection
        body, keep = (bytes(buffer[begin:]) if eof else None), False
    if body is None:
        return None
    return Http1Response(status, reason.decode("latin-1"), headers, body), keep


def _chunked(buffer: bytearray, at: int) -> bytes | None:
    """A chunked body, once its last chunk and trailers are in."""
    pieces: list[bytes] = []
    while True:
        line_end = buffer.find(b"\r\n", at)
        if line_end < 0:
            return None
        size_text = bytes(buffer[at:line_end]).split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise Http1Error(f"bad chunk size {size_text[:40]!r}") from None
        at = line_end + 2
        if size == 0:
            return b"".join(pieces) if buffer.find(b"\r\n\r\n", at - 2) >= 0 else None
        if len(buffer) < at + size + 2:
            return None
        pieces.append(bytes(buffer[at:at + size]))
        at += size + 2


class Http1Pool:
    """Keep-alive connections to one origin, made as calls need them (no cap: the
    executor bounds the calls in flight) and kept while the server keeps them."""

    def __init__(self, base_url: str, headers: dict[str, str], timeout_s: float,
                 connect_timeout_s: float, ssl_context: ssl.SSLContext | None = None) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        # The system's CAs (SSL_CERT_FILE / SSL_CERT_DIR honoured), unless given another.
        self._ssl = ((ssl_context or ssl.create_default_context())
                     if parts.scheme == "https" else None)
        self._prefix = parts.path.rstrip("/") + "/"
        authority = parts.netloc.rpartition("@")[2]
        fixed = {"Host": authority, **headers}
        self._head = "".join(f"{name}: {value}\r\n" for name, value in fixed.items()).encode()
        self._timeout_s, self._connect_timeout_s = timeout_s, connect_timeout_s
        self._idle: list[_Connection] = []
        self._deadlines: dict[asyncio.Future[Http1Response], float] = {}  # calls in flight
        self._timer: asyncio.TimerHandle | None = None  # due at the earliest deadline
        self._timer_at = 0.0

    async def post(self, path: str, body: bytes, head: bytes = b"") -> Http1Response:
        """POST `body` to the base URL's path + `path`, with `head`'s header lines (each
        ending in CRLF) beside the pool's own; TimeoutError past the timeout."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        deadline = now + self._timeout_s
        connection = self._take(now) or await self._connect(deadline)
        payload = b"POST %s%s HTTP/1.1\r\n%s%sContent-Length: %d\r\n\r\n%s" % (
            self._prefix.encode(), path.encode(), self._head, head, len(body), body)
        answer = connection.request(payload)
        self._deadlines[answer] = deadline
        if self._timer is None or deadline < self._timer_at:
            self._expire_at(loop, deadline)
        try:
            response = await answer
        except BaseException:
            connection.abort()
            raise
        finally:
            del self._deadlines[answer]
        if connection.reusable:
            connection.idle_since = loop.time()
            self._idle.append(connection)
        elif connection.transport is not None:
            connection.transport.close()
        return response

    def _expire_at(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = loop.call_at(when, self._expire_due, loop), when

    def _expire_due(self, loop: asyncio.AbstractEventLoop) -> None:
        """Fail the calls past their deadline with TimeoutError; set the timer for the
        next deadline, if a call is still in flight."""
        self._timer = None
        now, earliest = loop.time(), float("inf")
        for answer, deadline in self._deadlines.items():
            if deadline <= now:
                if not answer.done():
                    answer.set_exception(TimeoutError())
            elif deadline < earliest:
                earliest = deadline
        if earliest != float("inf"):
            self._expire_at(loop, earliest)

    def _take(self, now: float) -> _Connection | None:
        """The most recently used connection still open and not idle past the expiry;
        the rest below it are older still, so an expired one closes them all."""
        while self._idle:
            connection = self._idle.pop()
            if not connection.reusable:
                continue
            if now - connection.idle_since < IDLE_EXPIRY_S:
                return connection
            if connection.transport is not None:
                connection.transport.close()
            self.close()
        return None

    async def _connect(self, deadline: float) -> _Connection:
        loop = asyncio.get_running_loop()
        wait = min(self._connect_timeout_s, max(0.0, deadline - loop.time()))
        _, connection = await asyncio.wait_for(loop.create_connection(
            _Connection, self._host, self._port, ssl=self._ssl,
            server_hostname=self._host if self._ssl else None), wait)
        return connection

    def close(self) -> None:
        if self._timer is not None and not self._deadlines:
            self._timer.cancel()
            self._timer = None
        idle, self._idle = self._idle, []
        for connection in idle:
            if connection.transport is not None:
                connection.transport.close()

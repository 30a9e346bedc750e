"""Writing a job's item rows (and the error rows of its invalid lines) in bulk.

Ingest (quotaflow/ingest/pipeline.py) hands over one row per line while it reads the file;
these writers stream them into the open transaction. PostgreSQL gets one
binary `COPY items FROM STDIN` for the whole file, fed as the lines are parsed, so the
server inserts while Python parses the next lines; SQLite (the embedded
`quotaflow run`) gets batched INSERTs. Rows are pre-rendered bytes, never ORM
objects, and nothing is kept once it has been sent: the error rows of invalid
lines wait in a spooled temporary file (a disk file past 1 MiB) until the items
are in, since one connection runs one COPY at a time.

A duplicate custom_id is caught by the items' unique index (job_id, custom_id)
rather than by a set of every custom_id in memory; the writer reports it as
DuplicateCustomId and the caller rolls the transaction back.
"""

import binascii
import contextlib
import queue
import struct
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, cast

import psycopg
from sqlalchemy import DateTime, bindparam, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from quotaflow import store
from quotaflow.errors import QuotaflowError
from quotaflow.models import Item, ItemStatus, utcnow

ROWS_PER_SEND = 1000  # about 400 KiB of COPY data for typical lines
QUEUED_SENDS = 16  # pieces waiting for the COPY thread: a few MiB at most
CUSTOM_ID_INDEX = "uq_items_job_custom_id"
_ITEM_COLUMNS = ("job_id, line_no, custom_id, body, status, attempts, lease_expires_at, body_hash, "
                 "route")
_RESULT_COLUMNS = ("job_id, line_no, custom_id, request_id, error, prompt_tokens, "
                   "completion_tokens, created_at")
_COPY_SPECIAL = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
# COPY's binary format (https://www.postgresql.org/docs/current/sql-copy.html): a header,
# rows of (field count, then each field as its length and bytes, -1 for NULL), a trailer.
_BINARY_HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)  # the signature, no flags, no extension
_BINARY_TRAILER = b"\xff\xff"  # a field count of -1
_FIELDS = struct.pack(">h", len(_ITEM_COLUMNS.split(",")))
_INT4 = struct.Struct(">i").pack
_INT4_ZERO = struct.pack(">ii", 4, 0)  # an int4 field of 0
_INT8 = struct.Struct(">iq").pack  # (8, value): an int8 or timestamptz field
_LINE = struct.Struct(">ii").pack  # (4, line_no): the line_no field
_LINE_AND_LENGTH = struct.Struct(">iii").pack  # the line_no field, then custom_id's length
_NULL = _INT4(-1)
_FAILED = _INT4(len(b"failed")) + b"failed"
_HASH_LENGTH = _INT4(64)  # a SHA-256 in hex
# timestamptz's binary value: microseconds since 2000-01-01 UTC.
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


@dataclass
class DuplicateCustomId(QuotaflowError):
    """Two lines share a custom_id. SQLite's writer names both lines; PostgreSQL names
    only the id, so the lines are None and the caller finds them. Ingest turns this
    into the InputFileError the user sees."""

    custom_id: str
    first_line: int | None = None
    second_line: int | None = None

    def __post_init__(self) -> None:
        super().__init__(f"duplicate custom_id {self.custom_id!r}")


class RowWriter(Protocol):
    """Where ingest puts each line's rows; `close` raises DuplicateCustomId."""

    def pending(self, line_no: int, custom_id: str, body: bytes, digest: bytes | None,
                route: str) -> None: ...

    def invalid(self, line_no: int, custom_id: str | None, request_id: str,
                error: bytes) -> None: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...


@contextmanager
def row_writer(session: Session, job_id: str, lease_until: datetime) -> Iterator[RowWriter]:
    """The fastest writer the session's database offers; everything written is sent
    when the block ends (and abandoned, for the rollback, when it raises)."""
    if store.of(session).copies:
        writer: RowWriter = _CopyWriter(session, job_id, lease_until)
    else:
        writer = _InsertWriter(session, job_id, lease_until)
    try:
        yield writer
    except BaseException:
        writer.abort()
        raise
    writer.close()


def _copy_text(value: str) -> bytes:
    """A string as a COPY text-format field (JSON needs only its backslashes doubled)."""
    if value.isprintable() and "\\" not in value:  # tab, newline and CR are not printable
        return value.encode()
    return value.translate(_COPY_SPECIAL).encode()


def _field(value: bytes) -> bytes:
    """A value as a binary COPY field: its length, then its bytes."""
    return _INT4(len(value)) + value


class _CopyWriter:
    """One binary COPY for every item row, fed as the lines are read; the invalid lines'
    error rows are spooled and copied into results after it.

    The item rows are in COPY's binary format: each field is its length and its bytes,
    so the server neither scans the text for escapes nor parses the lease's timestamp
    on every row, and this side escapes nothing. The body is sent as the text of a json
    value, as the text format did (`json`'s binary form is its text)."""

    def __init__(self, session: Session, job_id: str, lease_until: datetime) -> None:
        self._connection = cast("psycopg.Connection[Any]",
                                session.connection().connection.driver_connection)
        self._job = _copy_text(job_id)
        self._now = utcnow().isoformat().encode()
        # What every row of this job starts with (its field count and job_id), and the
        # fields of a pending row after its body: status, attempts, lease_expires_at.
        self._row_start = _FIELDS + _field(job_id.encode())
        lease = (lease_until - _PG_EPOCH) // timedelta(microseconds=1)
        self._pending_middle = _field(b"pending") + _INT4_ZERO + _INT8(8, lease)
        self._routes: dict[str, bytes] = {}  # route name -> its field
        self._rows: list[bytes] = [_BINARY_HEADER]
        self._spool = tempfile.SpooledTemporaryFile(max_size=1024 * 1024)  # noqa: SIM115
        self._cursor = self._connection.cursor()
        self._copy_block = self._cursor.copy(
            f"COPY items ({_ITEM_COLUMNS}) FROM STDIN (FORMAT BINARY)")
        self._sender = _Sender(self._copy_block.__enter__())

    def pending(self, line_no: int, custom_id: str, body: bytes, digest: bytes | None,
                route: str) -> None:
        custom = custom_id.encode()
        route_field = self._routes.get(route)
        if route_field is None:
            route_field = self._routes[route] = _field(route.encode())
        rows = self._rows
        rows.append(b"".join((
            self._row_start, _LINE_AND_LENGTH(4, line_no, len(custom)), custom,
            _INT4(len(body)), body, self._pending_middle,
            _NULL if digest is None else _HASH_LENGTH + binascii.hexlify(digest),
            route_field)))
        if len(rows) >= ROWS_PER_SEND:
            self._send()

    def invalid(self, line_no: int, custom_id: str | None, request_id: str,
                error: bytes) -> None:
        custom = None if custom_id is None else custom_id.encode()
        self._rows.append(b"".join((
            self._row_start, _LINE(4, line_no),
            _NULL if custom is None else _field(custom), _NULL, _FAILED, _INT4_ZERO,
            _NULL * 3)))
        cid = b"\\N" if custom_id is None else _copy_text(custom_id)
        self._spool.write(b"%b\t%d\t%b\t%b\t%b\t0\t0\t%b\n" % (
            self._job, line_no, cid, request_id.encode(), error.replace(b"\\", b"\\\\"),
            self._now))
        if len(self._rows) >= ROWS_PER_SEND:
            self._send()

    def _send(self) -> None:
        with self._translated():
            self._sender.put(b"".join(self._rows))
        self._rows = []

    def close(self) -> None:
        try:
            self._rows.append(_BINARY_TRAILER)
            self._send()
            with self._translated():
                self._sender.finish()
        except BaseException:
            self.abort()
            raise
        try:
            with self._translated():
                self._copy_block.__exit__(None, None, None)
                if self._spool.tell():
                    self._spool.seek(0)
                    with self._cursor.copy(f"COPY results ({_RESULT_COLUMNS}) FROM STDIN") as copy:
                        while chunk := self._spool.read(1024 * 1024):
                            copy.write(chunk)
        finally:
            self._spool.close()
            self._cursor.close()

    def abort(self) -> None:
        """End the COPY with an error (the server discards it) so the rollback can run."""
        with contextlib.suppress(Exception):
            self._sender.finish()
        with contextlib.suppress(psycopg.Error):
            self._copy_block.__exit__(RuntimeError, RuntimeError("ingest stopped"), None)
        self._spool.close()
        self._cursor.close()

    @contextmanager
    def _translated(self) -> Iterator[None]:
        try:
            yield
        except psycopg.errors.UniqueViolation as exc:
            if exc.diag.constraint_name != CUSTOM_ID_INDEX:
                raise
            # "Key (job_id, custom_id)=(batch_..., THE ID) already exists."
            detail = exc.diag.message_detail or ""
            prefix = f"Key (job_id, custom_id)=({self._job.decode()}, "
            custom_id = detail.removeprefix(prefix).removesuffix(") already exists.")
            raise DuplicateCustomId(custom_id) from None


class _Sender:
    """Feeds the COPY from a thread of its own. A write blocks while the socket's buffer
    is full, that is, until the server has stored what came before; from here it blocks
    only this thread, so the server stores rows while the caller parses the next lines.
    At most QUEUED_SENDS pieces wait, so memory stays bounded when the server is slower."""

    def __init__(self, copy: psycopg.Copy) -> None:
        self._copy = copy
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=QUEUED_SENDS)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="quotaflow-copy", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while (data := self._queue.get()) is not None:
                self._copy.write(data)
        except BaseException as exc:  # handed to the caller at its next put or finish
            self._error = exc
            while self._queue.get() is not None:  # let the caller's puts through
                pass

    def put(self, data: bytes) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put(data)

    def finish(self) -> None:
        """Wait until everything is written; the first error, if any, is raised here."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        if self._error is not None:
            raise self._error


class _InsertWriter:
    """Batched INSERTs (SQLite): a duplicate custom_id is looked up in the failed batch."""

    _items = text(f"INSERT INTO items ({_ITEM_COLUMNS}) VALUES (:job_id, :line_no, "
                  ":custom_id, :body, :status, 0, :lease, :body_hash, :route)"
                  ).bindparams(bindparam("lease", type_=DateTime(timezone=True)))
    _results = text(f"INSERT INTO results ({_RESULT_COLUMNS}) VALUES (:job_id, :line_no, "
                    ":custom_id, :request_id, :error, 0, 0, :now)"
                    ).bindparams(bindparam("now", type_=DateTime(timezone=True)))

    def __init__(self, session: Session, job_id: str, lease_until: datetime) -> None:
        self._session = session
        self._job_id = job_id
        self._lease = lease_until
        self._now = utcnow()
        self._rows: list[dict[str, Any]] = []
        self._errors: list[dict[str, Any]] = []

    def pending(self, line_no: int, custom_id: str, body: bytes, digest: bytes | None,
                route: str) -> None:
        self._rows.append({"job_id": self._job_id, "line_no": line_no, "custom_id": custom_id,
                           "body": body.decode(), "status": ItemStatus.PENDING,
                           "lease": self._lease,
                           "body_hash": None if digest is None else digest.hex(),
                           "route": route})
        if len(self._rows) >= ROWS_PER_SEND:
            self._send()

    def invalid(self, line_no: int, custom_id: str | None, request_id: str,
                error: bytes) -> None:
        self._rows.append({"job_id": self._job_id, "line_no": line_no, "custom_id": custom_id,
                           "body": None, "status": ItemStatus.FAILED, "lease": None,
                           "body_hash": None, "route": None})
        self._errors.append({"job_id": self._job_id, "line_no": line_no,
                             "custom_id": custom_id, "request_id": request_id,
                             "error": error.decode(), "now": self._now})
        if len(self._rows) >= ROWS_PER_SEND:
            self._send()

    def _send(self) -> None:
        try:
            self._session.execute(self._items, self._rows)
        except IntegrityError:
            raise self._duplicate() from None
        if self._errors:
            self._session.execute(self._results, self._errors)
        self._rows, self._errors = [], []

    def _duplicate(self) -> DuplicateCustomId:
        """The first row of the refused batch whose custom_id came before (SQLite undoes
        only the failed statement, so the earlier rows can still be read)."""
        earlier: dict[str | None, int] = {}  # the ids asked for: never None
        ids = [row["custom_id"] for row in self._rows if row["custom_id"] is not None]
        for start in range(0, len(ids), 500):
            earlier.update((cid, line) for cid, line in self._session.execute(
                select(Item.custom_id, Item.line_no)
                .where(Item.job_id == self._job_id, Item.custom_id.in_(ids[start:start + 500]))))
        for row in self._rows:
            cid = row["custom_id"]
            if cid is not None:
                first = earlier.setdefault(cid, row["line_no"])
                if first != row["line_no"]:
                    return DuplicateCustomId(cid, first, row["line_no"])
        raise AssertionError("the unique index refused a batch without a duplicate custom_id")

    def close(self) -> None:
        if self._rows:
            self._send()

    def abort(self) -> None:
        self._rows, self._errors = [], []

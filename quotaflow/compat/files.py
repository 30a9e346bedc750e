"""Uploaded files, as OpenAI's Files API describes them, and the output files of batches.

An upload is copied into `file_chunks` piece by piece as it streams in, in one
transaction, so a file over the size limit leaves nothing behind and no file
is ever held in memory whole. A batch's output and error files are not stored
at all: they are views of its result rows (ids derived from the batch id), so
they are always complete, in input order, and partial while the batch runs.

An upload may expire (`expires_at`, from its `expires_after` or
QUOTAFLOW_FILE_RETENTION_S); from that moment it is "not found", and the worker's sweep
removes its bytes (quotaflow/compat/retention.py, which also deletes on request).
"""

import io
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import IO, Any

from sqlalchemy import insert, or_, select
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.errors import (
    FileNotFound,
    FileTooLarge,
    InvalidParameter,
    JobNotFound,
)
from quotaflow.jobs import service as jobs
from quotaflow.jobs import view as job_view
from quotaflow.models import File, FileChunk, Job, utcnow
from quotaflow.results import output
from quotaflow.results.output_pieces import output_pieces, output_stream
from quotaflow.tenants import audit

CHUNK_BYTES = 1024 * 1024
PURPOSE_BATCH = "batch"
PURPOSE_BATCH_OUTPUT = "batch_output"
STATUS_PROCESSED = "processed"
# Virtual files: f"{prefix}{hex of the batch id}"; plain uploads are "file-" + 32 hex.
OUTPUT_PREFIX = "file-out-"
ERROR_PREFIX = "file-err-"
JOB_PREFIX = "batch_"


def store_file(sessions: sessionmaker[Session], stream: IO[bytes], *, tenant: str,
               filename: str, purpose: str, max_bytes: int,
               expires_after_s: int | None = None, actor: audit.Actor | None = None) -> File:
    """Copy an upload into the database chunk by chunk; refuse it whole when too large.
    It expires `expires_after_s` after its creation (None: kept until deleted)."""
    if purpose != PURPOSE_BATCH:
        raise InvalidParameter("purpose", f"purpose {purpose!r} is not supported: quotaflow "
                                          f"stores files for batches only "
                                          f"(purpose={PURPOSE_BATCH!r})")
    file_id = f"file-{uuid.uuid4().hex}"
    size = 0
    with sessions.begin() as session:
        name = filename.replace("\x00", "") or "upload.jsonl"  # no NUL in a text column
        now = utcnow()
        expires = None if expires_after_s is None else now + timedelta(seconds=expires_after_s)
        row = File(id=file_id, tenant=tenant, filename=name[:255], purpose=purpose, bytes=0,
                   status=STATUS_PROCESSED, created_at=now, expires_at=expires)
        session.add(row)
        session.flush()
        seq = 0
        while chunk := stream.read(CHUNK_BYTES):
            size += len(chunk)
            if size > max_bytes:
                raise FileTooLarge(f"the file is larger than the upload limit of {max_bytes} "
                                   "bytes (QUOTAFLOW_MAX_UPLOAD_BYTES)")
            session.execute(insert(FileChunk), [{"file_id": file_id, "seq": seq, "data": chunk}])
            seq += 1
        row.bytes = size
        audit.record(session, actor, "create", "file", file_id)
    return row


def get_file(session: Session, file_id: str, tenant: str | None) -> File:
    """A stored upload of `tenant` (any tenant's when None), unless it has expired."""
    row = session.get(File, file_id)
    if (row is None or (tenant is not None and row.tenant != tenant)
            or (row.expires_at is not None and row.expires_at <= utcnow())):
        raise FileNotFound(f"no file with id {file_id!r}")
    return row


def list_files(session: Session, tenant: str | None, *, limit: int, after: str | None = None,
               purpose: str | None = None, ascending: bool = False) -> list[File]:
    """A page of uploads; `after` is the id of the last file of the previous page."""
    order = (File.created_at.asc(), File.id.asc()) if ascending else (
        File.created_at.desc(), File.id.desc())
    query = (select(File).order_by(*order).limit(limit)
             .where(or_(File.expires_at.is_(None), File.expires_at > utcnow())))
    if tenant is not None:
        query = query.where(File.tenant == tenant)
    if purpose is not None:
        query = query.where(File.purpose == purpose)
    if after is not None:
        anchor = get_file(session, after, tenant)
        if ascending:
            query = query.where(File.created_at >= anchor.created_at, File.id != anchor.id)
        else:
            query = query.where(File.created_at <= anchor.created_at, File.id != anchor.id)
    return list(session.scalars(query))


def iter_chunks(session: Session, file_id: str) -> Iterator[bytes]:
    """The stored bytes of an upload, a chunk at a time."""
    query = (select(FileChunk.data).where(FileChunk.file_id == file_id)
             .order_by(FileChunk.seq).execution_options(yield_per=4))
    for (data,) in session.execute(query):
        yield bytes(data)


class ChunkStream(io.RawIOBase):
    """A readable stream over byte chunks made as they are read, so stored files (and a
    Message Batches body's requests, message_batch_body.py) feed the same parser as
    uploads."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._pending = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            self._pending = next(self._chunks, b"")
            if not self._pending:
                return 0
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size


def open_stored(session: Session, file_id: str) -> IO[bytes]:
    """A buffered binary stream (with readline) over an upload's stored bytes."""
    return io.BufferedReader(ChunkStream(iter_chunks(session, file_id)), CHUNK_BYTES)


def file_object(row: File) -> dict[str, Any]:
    """OpenAI's file object."""
    return {"id": row.id, "object": "file", "bytes": row.bytes,
            "created_at": _unix(row.created_at), "filename": row.filename,
            "purpose": row.purpose, "status": row.status, "status_details": None,
            "expires_at": None if row.expires_at is None else _unix(row.expires_at)}


# --- a batch's output and error files, derived from its results -----------------------

@dataclass(frozen=True)
class VirtualFile:
    """A batch's output (errors=False) or error file."""

    id: str
    job_id: str
    errors: bool


def output_file_id(job_id: str, errors: bool) -> str:
    return (ERROR_PREFIX if errors else OUTPUT_PREFIX) + job_id.removeprefix(JOB_PREFIX)


def _virtual(file_id: str) -> VirtualFile | None:
    for prefix, errors in ((OUTPUT_PREFIX, False), (ERROR_PREFIX, True)):
        if file_id.startswith(prefix):
            return VirtualFile(file_id, JOB_PREFIX + file_id.removeprefix(prefix), errors)
    return None


def virtual_file(session: Session, file_id: str, tenant: str | None) -> VirtualFile | None:
    """The batch output file `file_id` names, None for a plain upload id.

    Raises FileNotFound when it names a batch that does not exist or is another tenant's,
    or whose results were deleted or expired.
    """
    virtual = _virtual(file_id)
    if virtual is None:
        return None
    try:
        job = jobs.get_job(session, virtual.job_id, tenant=tenant)
    except JobNotFound as exc:
        raise FileNotFound(f"no file with id {file_id!r}") from exc
    if job_view.results_gone(job, utcnow()):
        raise FileNotFound(f"no file with id {file_id!r}: the results of batch {job.id} "
                           "were deleted or expired")
    return virtual


def virtual_lines(session: Session, virtual: VirtualFile) -> Iterator[str]:
    return output.iter_output(session, virtual.job_id, errors=virtual.errors)


def virtual_pieces(session: Session, virtual: VirtualFile) -> Iterator[bytes]:
    """The batch output or error file's bytes, in pieces (output_pieces.py)."""
    return output_pieces(session, virtual.job_id, virtual.errors)


def virtual_stream(sessions: sessionmaker[Session], virtual: VirtualFile) -> Iterator[bytes]:
    """virtual_pieces made ahead of the one being sent, on connections of their own."""
    return output_stream(sessions, virtual.job_id, virtual.errors)


def virtual_object(session: Session, virtual: VirtualFile) -> dict[str, Any]:
    job = session.get(Job, virtual.job_id)
    assert job is not None  # checked by virtual_file
    size = sum(len(piece) for piece in virtual_pieces(session, virtual))
    kind = "error" if virtual.errors else "output"
    return {"id": virtual.id, "object": "file", "bytes": size,
            "created_at": _unix(job.completed_at or job.cancelled_at or job.expired_at
                                or job.created_at),
            "filename": f"{job.id}_{kind}.jsonl", "purpose": PURPOSE_BATCH_OUTPUT,
            "status": STATUS_PROCESSED, "status_details": None,
            "expires_at": None if (expires := job_view.output_expires_at(job)) is None
            else _unix(expires)}


def _unix(moment: datetime) -> int:
    return int(moment.timestamp())

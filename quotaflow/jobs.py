"""The job service: the one place jobs are created, read, cancelled and finished.

The API, the CLI and the workers all come through here, so every view of a
job (REST, CLI, embedded run) reports the same statuses and counts.
"""

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import IO, Any, Protocol

from sqlalchemy import case, delete, exists, func, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.config import Deployments, Settings
from quotaflow.constants import DEFAULT_TENANT, QUEUES
from quotaflow.errors import InputFileError, JobNotFound, JobStateError, LineProblem
from quotaflow.formats import (
    BadLine,
    Request,
    dumps_line,
    output_line,
    parse_stream,
    request_digest,
)
from quotaflow.models import Item, ItemStatus, Job, JobStatus, Result, utcnow

INSERT_CHUNK = 1000
# A job may ask for more tries per request than the default, within reason.
MAX_ATTEMPTS_LIMIT = 20


@dataclass(frozen=True)
class BatchRef:
    """What a queue message carries: a job and an inclusive line range, never prompts."""

    job_id: str
    first_line: int
    last_line: int


class Dispatcher(Protocol):
    """Hands a new job's batches to whatever runs them (Celery, or in-process)."""

    def dispatch(self, queue: str, batches: list[BatchRef]) -> None: ...


def new_request_id() -> str:
    return f"batch_req_{uuid.uuid4().hex}"


def stable_request_id(job_id: str, line_no: int) -> str:
    """An id for a line that never reached a provider, the same on every download."""
    return f"batch_req_{uuid.uuid5(uuid.NAMESPACE_URL, f'{job_id}/{line_no}').hex}"


class _SizeLimitedReader:
    """Wraps an upload so a file over the size limit is refused while it streams."""

    def __init__(self, stream: IO[bytes], limit: int) -> None:
        self._stream = stream
        self._limit = limit
        self._read = 0

    def readline(self, size: int = -1) -> bytes:
        line = self._stream.readline(size)
        self._read += len(line)
        if self._read > self._limit:
            raise InputFileError(
                f"the file is larger than the limit of {self._limit} bytes "
                "(QUOTAFLOW_MAX_FILE_BYTES)")
        return line


class _Ingest:
    """Accumulates one file's rows; raises InputFileError for file-level problems."""

    def __init__(self, job_id: str, deployments: Deployments, max_lines: int,
                 queued_until: datetime, dedup: bool) -> None:
        self.job_id = job_id
        self.dedup = dedup
        self.first_of: dict[str, int] = {}  # request digest -> the line that is sent
        self.queued_until = queued_until
        self.deployments = deployments
        self.max_lines = max_lines
        self.endpoint: str | None = None
        self.seen: dict[str, int] = {}
        self.items: list[dict[str, Any]] = []
        self.results: list[dict[str, Any]] = []
        self.valid_lines: list[int] = []
        self.total = 0

    def add(self, entry: Request | BadLine) -> None:
        self.total += 1
        if self.total > self.max_lines:
            raise InputFileError(f"the file has more than {self.max_lines} requests "
                                 "(QUOTAFLOW_MAX_LINES); split it into several jobs")
        if isinstance(entry, Request):
            entry = self._check_request(entry)
        if entry.custom_id is not None:
            first = self.seen.setdefault(entry.custom_id, entry.line_no)
            if first != entry.line_no:
                raise InputFileError(
                    f"duplicate custom_id {entry.custom_id!r} on lines {first} and "
                    f"{entry.line_no}; each custom_id must be unique within a file",
                    [LineProblem(entry.line_no, f"duplicate custom_id {entry.custom_id!r}")])
        if isinstance(entry, Request):
            self._add_request(entry)
        else:
            self.items.append(dict(job_id=self.job_id, line_no=entry.line_no,
                                   custom_id=entry.custom_id, body=None,
                                   status=ItemStatus.FAILED, attempts=0))
            self.results.append(dict(
                job_id=self.job_id, line_no=entry.line_no, custom_id=entry.custom_id,
                request_id=new_request_id(), status_code=None, response=None,
                error={"code": "invalid_request", "line": entry.line_no,
                       "message": f"line {entry.line_no}: {entry.reason}"},
                prompt_tokens=0, completion_tokens=0))

    def _add_request(self, request: Request) -> None:
        """A valid line: sent, or, when an identical request came earlier, waiting for
        that one's answer."""
        digest = request_digest(request.url, request.body)
        first = self.first_of.setdefault(digest, request.line_no) if self.dedup else None
        duplicate_of = first if first is not None and first != request.line_no else None
        if duplicate_of is None:
            self.valid_lines.append(request.line_no)
        self.items.append(dict(
            job_id=self.job_id, line_no=request.line_no, custom_id=request.custom_id,
            body=request.body, body_hash=digest, duplicate_of=duplicate_of,
            status=ItemStatus.PENDING if duplicate_of is None else ItemStatus.WAITING,
            attempts=0, lease_expires_at=self.queued_until if duplicate_of is None else None))

    def _check_request(self, request: Request) -> Request | BadLine:
        if self.endpoint is None:
            self.endpoint = request.url
        elif request.url != self.endpoint:
            return BadLine(request.line_no, request.custom_id,
                           f"url {request.url} differs from the job's endpoint {self.endpoint}; "
                           "all lines of one file must use the same endpoint")
        if self.deployments.route_for(request.body.get("model")) is None:
            return BadLine(request.line_no, request.custom_id,
                           f"no deployment serves model {request.body.get('model')!r}; "
                           "add a route for it to the deployments file")
        return request

    def flush(self, session: Session) -> None:
        if self.items:
            session.execute(insert(Item), self.items)
            self.items = []
        if self.results:
            session.execute(insert(Result), self.results)
            self.results = []


def create_job(
    sessions: sessionmaker[Session],
    stream: IO[bytes],
    *,
    settings: Settings,
    deployments: Deployments,
    dispatcher: Dispatcher,
    queue: str,
    filename: str | None = None,
    metadata: dict[str, str] | None = None,
    max_attempts: int | None = None,
    tenant: str = DEFAULT_TENANT,
    input_file_id: str | None = None,
    enqueued_tokens: int | None = None,
) -> Job:
    """Store a JSONL file as a job and dispatch its batches, or store nothing at all.

    Lines that fail validation become failed items with their line number and
    reason; the job runs its good lines. A file-level problem (empty, too big,
    duplicate custom_id, no valid line) raises InputFileError inside the
    transaction, so nothing of the file is written. Identical requests are stored
    once as sent and otherwise as waiting for that one's answer (QUOTAFLOW_DEDUP).
    """
    if queue not in QUEUES:
        raise JobStateError(f"unknown queue {queue!r}; choose one of {', '.join(QUEUES)}")
    if max_attempts is not None and not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT:
        raise JobStateError(f"max_attempts must be between 1 and {MAX_ATTEMPTS_LIMIT}, "
                            f"got {max_attempts}")
    job_id = f"batch_{uuid.uuid4().hex}"
    queued_until = utcnow() + timedelta(seconds=settings.queue_patience_s)
    ingest = _Ingest(job_id, deployments, settings.max_lines, queued_until, settings.dedup)
    reader = _SizeLimitedReader(stream, settings.max_file_bytes)
    problems: list[LineProblem] = []
    with sessions.begin() as session:
        now = utcnow()
        job = Job(id=job_id, status=JobStatus.VALIDATING, queue=queue, endpoint="",
                  input_filename=filename, total=0, metadata_=metadata, created_at=now,
                  max_attempts=max_attempts,
                  expires_at=now + timedelta(seconds=settings.completion_window_s),
                  tenant=tenant, input_file_id=input_file_id, enqueued_tokens=enqueued_tokens)
        session.add(job)
        session.flush()
        for entry in parse_stream(reader, settings.max_line_bytes):
            if isinstance(entry, BadLine):
                problems.append(LineProblem(entry.line_no, entry.reason))
            ingest.add(entry)
            if len(ingest.items) >= INSERT_CHUNK:
                ingest.flush(session)
        ingest.flush(session)
        if ingest.total == 0:
            raise InputFileError("the file is empty: it has no request lines")
        if not ingest.valid_lines:
            raise InputFileError("no line of the file is a valid request", problems)
        job.total = ingest.total
        job.endpoint = ingest.endpoint or ""
        job.status = JobStatus.IN_PROGRESS
        job.in_progress_at = utcnow()
    dispatcher.dispatch(queue, batch_refs(job_id, ingest.valid_lines, settings.batch_size))
    return job


def batch_refs(job_id: str, line_numbers: list[int], batch_size: int) -> list[BatchRef]:
    return [
        BatchRef(job_id, chunk[0], chunk[-1])
        for chunk in (line_numbers[i:i + batch_size]
                      for i in range(0, len(line_numbers), batch_size))
    ]


def get_job(session: Session, job_id: str, tenant: str | None = None) -> Job:
    """The job; with `tenant`, only if it is that tenant's (another's is "not found")."""
    job = session.get(Job, job_id)
    if job is None or (tenant is not None and job.tenant != tenant):
        raise JobNotFound(f"no job with id {job_id!r}")
    return job


def list_jobs(session: Session, limit: int = 20, after: str | None = None,
              tenant: str | None = None) -> list[Job]:
    """Newest first; `after` is the id of the last job of the previous page."""
    query = select(Job).order_by(Job.created_at.desc(), Job.id.desc()).limit(limit)
    if tenant is not None:
        query = query.where(Job.tenant == tenant)
    if after is not None:
        anchor = get_job(session, after, tenant)
        query = query.where(Job.created_at <= anchor.created_at, Job.id != anchor.id)
    return list(session.scalars(query))


def item_counts(session: Session, job_id: str) -> dict[str, int]:
    rows = session.execute(
        select(Item.status, func.count()).where(Item.job_id == job_id).group_by(Item.status))
    return {status: count for status, count in rows}


def usage_totals(session: Session, job_id: str) -> tuple[int, int]:
    prompt, completion = session.execute(
        select(func.coalesce(func.sum(Result.prompt_tokens), 0),
               func.coalesce(func.sum(Result.completion_tokens), 0))
        .where(Result.job_id == job_id)).one()
    return int(prompt), int(completion)


def _unix(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp())


def job_object(session: Session, job: Job) -> dict[str, Any]:
    """The job as OpenAI describes a batch, plus quotaflow's queue."""
    counts = item_counts(session, job.id)
    prompt, completion = usage_totals(session, job.id)
    return {
        "id": job.id,
        "object": "batch",
        "endpoint": job.endpoint,
        "status": job.status,
        "queue": job.queue,
        "input_filename": job.input_filename,
        "request_counts": {
            "total": job.total,
            "completed": counts.get(ItemStatus.SUCCEEDED, 0),
            "failed": counts.get(ItemStatus.FAILED, 0),
            "pending": sum(counts.get(status, 0) for status in ItemStatus.OPEN),
            "cancelled": counts.get(ItemStatus.CANCELLED, 0),
            "expired": counts.get(ItemStatus.EXPIRED, 0),
        },
        "usage": {"input_tokens": prompt, "output_tokens": completion,
                  "total_tokens": prompt + completion},
        "metadata": job.metadata_,
        "max_attempts": job.max_attempts,
        **{name: _unix(getattr(job, name)) for name in (
            "created_at", "in_progress_at", "finalizing_at", "completed_at", "failed_at",
            "cancelling_at", "cancelled_at", "expired_at", "expires_at")},
    }


def cancel_job(sessions: sessionmaker[Session], job_id: str) -> Job:
    """Stop new calls for the job; calls in flight finish and keep their results."""
    with sessions.begin() as session:
        job = get_job(session, job_id)
        if job.status in (JobStatus.CANCELLING, JobStatus.CANCELLED):
            return job
        if job.status not in JobStatus.ACTIVE:
            raise JobStateError(f"job {job_id} is {job.status} and can no longer be cancelled")
        job.status = JobStatus.CANCELLING
        job.cancelling_at = utcnow()
        session.execute(update(Item)
                        .where(Item.job_id == job_id,
                               Item.status.in_((ItemStatus.PENDING, ItemStatus.WAITING)))
                        .values(status=ItemStatus.CANCELLED))
    finish_if_done(sessions, job_id)
    with sessions() as session:
        return get_job(session, job_id)


def retry_failed(sessions: sessionmaker[Session], job_id: str, dispatcher: Dispatcher,
                 settings: Settings) -> int:
    """Run a job's failed requests again; invalid lines are not retried (they would fail
    the same way). Returns how many requests were queued again."""
    with sessions.begin() as session:
        job = get_job(session, job_id)
        if job.status not in (JobStatus.IN_PROGRESS, JobStatus.COMPLETED):
            raise JobStateError(f"job {job_id} is {job.status}; only in-progress or completed "
                                "jobs can retry their failed requests")
        failed = (Item.job_id == job_id, Item.status == ItemStatus.FAILED,
                  Item.body.is_not(None))
        # A failed duplicate waits for its original again rather than being sent itself.
        lines = sorted(session.scalars(
            update(Item)
            .where(*failed, Item.duplicate_of.is_(None))
            .values(status=ItemStatus.PENDING, lease_owner=None,
                    lease_expires_at=utcnow() + timedelta(seconds=settings.queue_patience_s))
            .returning(Item.line_no)).all())
        waiting = session.scalars(
            update(Item).where(*failed, Item.duplicate_of.is_not(None))
            .values(status=ItemStatus.WAITING, lease_owner=None, lease_expires_at=None)
            .returning(Item.line_no)).all()
        if not lines and not waiting:
            return 0
        session.execute(delete(Result).where(Result.job_id == job_id,
                                             Result.line_no.in_([*lines, *waiting])))
        job.status = JobStatus.IN_PROGRESS
        job.finalizing_at = job.completed_at = None
        queue = job.queue
    dispatcher.dispatch(queue, batch_refs(job_id, lines, settings.batch_size))
    return len(lines) + len(waiting)


def expire_overdue(sessions: sessionmaker[Session]) -> list[str]:
    """Jobs past their completion window: unsent requests expire, the job is `expired`.

    Calls in flight finish and keep their results; partial results stay downloadable.
    """
    now = utcnow()
    with sessions.begin() as session:
        overdue = session.scalars(
            update(Job)
            .where(Job.status == JobStatus.IN_PROGRESS, Job.expires_at < now)
            .values(status=JobStatus.EXPIRED, expired_at=now)
            .returning(Job.id)).all()
        if overdue:
            session.execute(update(Item)
                            .where(Item.job_id.in_(overdue),
                                   Item.status.in_((ItemStatus.PENDING, ItemStatus.WAITING)))
                            .values(status=ItemStatus.EXPIRED))
    return list(overdue)


def finish_if_done(sessions: sessionmaker[Session], job_id: str) -> None:
    """Move the job to its final status once no item is pending or running."""
    with sessions.begin() as session:
        close_if_done(session, job_id)


def close_if_done(session: Session, job_id: str) -> None:
    """finish_if_done inside the caller's transaction. One conditional UPDATE on the
    table (not the ORM entity: this runs after every batch), safe to run from every
    worker at once."""
    jobs, items = Job.__table__.c, Item.__table__.c
    open_items = exists().where(items.job_id == job_id, items.status.in_(ItemStatus.OPEN))
    now = utcnow()
    running = jobs.status == JobStatus.IN_PROGRESS
    session.execute(
        update(Job.__table__)
        .where(jobs.id == job_id,
               jobs.status.in_((JobStatus.IN_PROGRESS, JobStatus.CANCELLING)), ~open_items)
        .values(status=case((running, JobStatus.COMPLETED), else_=JobStatus.CANCELLED),
                finalizing_at=case((running, now), else_=jobs.finalizing_at),
                completed_at=case((running, now), else_=jobs.completed_at),
                cancelled_at=case((running, jobs.cancelled_at), else_=now)))


def iter_output(session: Session, job_id: str, errors: bool) -> Iterator[str]:
    """Result lines in input order: successes, or everything that did not succeed.

    Works while the job runs, so partial results can be downloaded.
    """
    get_job(session, job_id)
    query = (select(Item.line_no, Item.custom_id, Item.status, Result)
             .outerjoin(Result, (Result.job_id == Item.job_id) & (Result.line_no == Item.line_no))
             .where(Item.job_id == job_id).order_by(Item.line_no)
             .execution_options(yield_per=500))
    for line_no, custom_id, status, result in session.execute(query):
        if result is not None:
            if (result.error is None) != errors:
                yield dumps_line(output_line(result.request_id, result.custom_id,
                                             result.status_code, result.response, result.error,
                                             result.shared_from))
        elif errors and status in (ItemStatus.CANCELLED, ItemStatus.EXPIRED):
            code = "batch_cancelled" if status == ItemStatus.CANCELLED else "batch_expired"
            message = (f"line {line_no}: not sent because the job was "
                       f"{'cancelled' if status == ItemStatus.CANCELLED else 'expired'}")
            yield dumps_line(output_line(stable_request_id(job_id, line_no), custom_id, None, None,
                                         {"code": code, "line": line_no, "message": message}))

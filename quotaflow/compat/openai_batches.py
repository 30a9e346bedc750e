"""The OpenAI Batch API's view of quotaflow's jobs.

A batch *is* a job (same id, same rows): POST /v1/batches creates one from an
uploaded file through quotaflow.ingest.pipeline, and the batch object is the
job described in OpenAI's shape. As at OpenAI, a file refused as a whole
still gives a batch, with status `failed` and the reasons, line by line, in
`errors.data`; a good file with some bad lines runs its good lines, and the
bad ones are listed in `errors.data` and in the error file.

The batch is `validating` while its file is read: its row is committed first, then the
lines are stored in a second transaction that holds the row, which becomes `in_progress`
with them, or `failed` with the reasons when the file is refused. A batch whose
validation was cut off (the API process died) is failed by the workers' sweep
(fail_abandoned), which skips the rows an ingest holds.
"""

import contextlib
import re
import uuid
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.budget.caps import check_cap
from quotaflow.compat import files
from quotaflow.config import Settings
from quotaflow.constants import DEFAULT_QUEUE, ENDPOINTS, OUTPUT_OPENAI, QUEUES
from quotaflow.deployments.catalog import Deployments
from quotaflow.dispatch.queues import Dispatcher
from quotaflow.errors import InputFileError, InvalidParameter, ModelNotAllowed
from quotaflow.ingest import pipeline as ingest
from quotaflow.jobs import view as job_view
from quotaflow.models import Item, Job, JobStatus, Result, utcnow
from quotaflow.providers.outcomes import FailureCode
from quotaflow.tenants import audit
from quotaflow.tenants.grants import Allowlist

# Where a batch names its queue (quotaflow's extension; the X-Quotaflow-Queue header
# takes precedence).
QUEUE_METADATA_KEY = "quotaflow_queue"
# A batch's choice on sharing identical lines ("true" or "false"; unset: the rule of
# quotaflow/ingest/dedup.py), as metadata since OpenAI's request has no field for it.
DEDUP_METADATA_KEY = "quotaflow_dedup"
# The batch's own caps inside each deployment's budget (per minute), as metadata where a
# client cannot send the body fields max_rpm / max_tpm (the OpenAI SDK can: extra_body).
CAP_METADATA_KEYS = {"max_rpm": "quotaflow_max_rpm", "max_tpm": "quotaflow_max_tpm"}
MAX_ERRORS_SHOWN = 1000
_WINDOW = re.compile(r"^(\d{1,5})([hms])$")
_WINDOW_SECONDS = {"h": 3600, "m": 60, "s": 1}
FINAL = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.EXPIRED, JobStatus.CANCELLED)


@dataclass(frozen=True)
class BatchRequest:
    """POST /v1/batches, checked: which file, endpoint and window, for whom, on which queue."""

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None
    tenant: str
    queue: str | None = None
    idempotency_key: str | None = None
    # The models and deployments the request's key may use (None: any).
    allow: Allowlist | None = None
    actor: audit.Actor | None = None  # who makes it, for the audit log
    # Seconds its output and error files are kept after it ends (OpenAI's
    # output_expires_after, checked by retention.expires_after); None: the default.
    output_expires_after_s: int | None = None
    # Its caps, from the body's max_rpm / max_tpm (None: metadata's, if any).
    max_rpm: int | None = None
    max_tpm: int | None = None


def cap_choice(name: str, given: int | None, metadata: dict[str, str] | None) -> int | None:
    """A batch's cap: the body field, else its metadata key (a whole number as a string)."""
    if given is not None:
        return check_cap(name, given)
    key = CAP_METADATA_KEYS[name]
    value = (metadata or {}).get(key)
    if value is None:
        return None
    if not value.isdigit():
        raise InvalidParameter(f"metadata.{key}", f"metadata.{key} must be a whole number "
                                                  f"of at least 1, got {value!r}")
    return check_cap(f"metadata.{key}", int(value))


def window_seconds(window: str) -> int:
    """OpenAI accepts "24h"; quotaflow any N h/m/s (no 24-hour wait on one's own cluster)."""
    match = _WINDOW.match(window)
    if not match or int(match.group(1)) == 0:
        raise InvalidParameter("completion_window", f"completion_window {window!r} is not "
                               "supported; use e.g. \"24h\" (or any number of hours, minutes "
                               "or seconds: 2h, 30m)")
    return int(match.group(1)) * _WINDOW_SECONDS[match.group(2)]


def choose_queue(header: str | None, metadata: dict[str, str] | None) -> str:
    queue = header or (metadata or {}).get(QUEUE_METADATA_KEY) or DEFAULT_QUEUE
    if queue not in QUEUES:
        param = "X-Quotaflow-Queue" if header else f"metadata.{QUEUE_METADATA_KEY}"
        raise InvalidParameter(param, f"unknown queue {queue!r} (X-Quotaflow-Queue or "
                                      f"metadata.{QUEUE_METADATA_KEY}); choose one of "
                                      f"{', '.join(QUEUES)}")
    return queue


def dedup_choice(metadata: dict[str, str] | None) -> bool | None:
    value = (metadata or {}).get(DEDUP_METADATA_KEY)
    if value is None:
        return None
    if value not in ("true", "false"):
        raise InvalidParameter(f"metadata.{DEDUP_METADATA_KEY}",
                               f'metadata.{DEDUP_METADATA_KEY} must be "true" or "false", '
                               f"got {value!r}")
    return value == "true"


def create_batch(sessions: sessionmaker[Session], request: BatchRequest, *, settings: Settings,
                 deployments: Deployments, dispatcher: Dispatcher) -> Job:
    """Ingest the stored file as a job (quotaflow/ingest/pipeline.py), within the tenant's token
    quota and OpenAI's 50,000 lines (QUOTAFLOW_MAX_BATCH_LINES).

    A request that cannot be a batch at all (unknown endpoint, file or queue) raises;
    a file that cannot run gives a failed batch, as OpenAI reports validation failures.
    A refusal of the whole request (the tenant's quota or spend limit) raises and leaves
    no batch. The same idempotency key again gives the same batch.
    """
    if request.endpoint not in ENDPOINTS:
        raise InvalidParameter("endpoint", f"endpoint {request.endpoint!r} is not supported; "
                                           f"use one of {', '.join(ENDPOINTS)}")
    spec = ingest.JobSpec(
        queue=choose_queue(request.queue, request.metadata), tenant=request.tenant,
        metadata=request.metadata, input_file_id=request.input_file_id,
        idempotency_key=request.idempotency_key, endpoint=request.endpoint,
        max_lines=settings.max_batch_lines,
        completion_window_s=window_seconds(request.completion_window),
        # OpenAI's Batch API: its output file is OpenAI's, whatever shape the lines had.
        output_format=OUTPUT_OPENAI, dedup=dedup_choice(request.metadata),
        output_expires_after_s=request.output_expires_after_s,
        allow=request.allow, refuse_disallowed=True, actor=request.actor,
        max_rpm=cap_choice("max_rpm", request.max_rpm, request.metadata),
        max_tpm=cap_choice("max_tpm", request.max_tpm, request.metadata))
    with sessions() as session:
        upload = files.get_file(session, request.input_file_id, request.tenant)
        spec = replace(spec, filename=upload.filename)
        if request.idempotency_key is not None and (
                earlier := ingest.find_by_key(session, request.tenant,
                                              request.idempotency_key)) is not None:
            return earlier
    job_id = f"batch_{uuid.uuid4().hex}"
    with sessions.begin() as session:  # committed: `validating` is seen while it is read
        made = ingest.insert_job(session, job_id, spec, settings, JobStatus.VALIDATING)
    if not made:
        return _by_key(sessions, spec)
    try:
        with sessions() as session:
            return ingest.create_job(
                sessions, files.open_stored(session, upload.id), settings=settings,
                deployments=deployments, dispatcher=dispatcher, spec=spec, job_id=job_id,
                reopen=lambda: files.open_stored(session, upload.id)).job
    except ModelNotAllowed:
        _discard(sessions, job_id)  # refused as a request: 400, and no batch
        raise
    except InputFileError as exc:
        return _refused(sessions, job_id, exc)
    except BaseException:
        # Refused as a request (quota, spend) or cut off: no batch, as before it began.
        _discard(sessions, job_id)
        raise


def _discard(sessions: sessionmaker[Session], job_id: str) -> None:
    """The `validating` row of a batch refused as a request. With the database out of
    reach too, fail_abandoned fails it later."""
    with contextlib.suppress(SQLAlchemyError), sessions.begin() as session:
        session.execute(delete(Job).where(Job.id == job_id,
                                          Job.status == JobStatus.VALIDATING))


def _by_key(sessions: sessionmaker[Session], spec: ingest.JobSpec) -> Job:
    assert spec.idempotency_key is not None
    with sessions() as session:
        earlier = ingest.find_by_key(session, spec.tenant, spec.idempotency_key)
        assert earlier is not None
        return earlier


def _refused(sessions: sessionmaker[Session], job_id: str, exc: InputFileError) -> Job:
    """The batch whose file was refused: `failed`, nothing runs; the reasons in `errors`."""
    data = [_error(p.line_no, p.reason) for p in exc.problems[:MAX_ERRORS_SHOWN]]
    if not data:
        data = [_error(None, exc.message)]
    with sessions.begin() as session:
        session.execute(update(Job).where(Job.id == job_id, Job.status == JobStatus.VALIDATING)
                        .values(status=JobStatus.FAILED, failed_at=utcnow(), enqueued_tokens=0,
                                errors={"object": "list", "data": data}))
    with sessions() as session:
        return session.get_one(Job, job_id)


def fail_abandoned(sessions: sessionmaker[Session], older_than: timedelta) -> list[str]:
    """Fail batches left `validating` by an API process that died while reading their file
    (its transaction rolled back; no line is stored). A batch still being read is held by
    its ingest (ingest.lock_validating) and skipped; `older_than` covers the moment between
    the row's commit and that lock."""
    message = ("the batch's validation was cut off (the API stopped while reading its "
               "file); create the batch again")
    with sessions.begin() as session:
        stale = session.scalars(
            select(Job.id).where(Job.status == JobStatus.VALIDATING,
                                 Job.created_at < utcnow() - older_than)
            .limit(100).with_for_update(skip_locked=True, key_share=True)).all()
        if stale:
            session.execute(update(Job).where(Job.id.in_(stale)).values(
                status=JobStatus.FAILED, failed_at=utcnow(), enqueued_tokens=0,
                errors={"object": "list", "data": [_error(None, message)]}))
    return list(stale)


def _error(line: int | None, message: str) -> dict[str, Any]:
    return {"code": str(FailureCode.INVALID_REQUEST), "message": message, "param": None,
            "line": line}


def invalid_lines(session: Session, job_id: str) -> list[dict[str, Any]]:
    """The lines of a running batch refused at validation, as OpenAI's errors.data."""
    rows = session.execute(
        select(Result.line_no, Result.error)
        .join(Item, (Item.job_id == Result.job_id) & (Item.line_no == Result.line_no))
        .where(Result.job_id == job_id, Item.body.is_(None))
        .order_by(Result.line_no).limit(MAX_ERRORS_SHOWN))
    return [_error(line, (error or {}).get("message", "invalid request"))
            for line, error in rows]


def batch_object(session: Session, job: Job) -> dict[str, Any]:
    """The job as OpenAI's Batch object, plus quotaflow's `queue`."""
    view = job_view.job_object(session, job)
    counts = view["request_counts"]
    final = job.status in FINAL
    succeeded = counts["completed"]
    unsucceeded = counts["failed"] + counts["cancelled"] + counts["expired"]
    errors = job.errors or ({"object": "list", "data": data}
                            if (data := invalid_lines(session, job.id)) else None)
    window_s = (job.expires_at - job.created_at).total_seconds() if job.expires_at else 86400
    return {
        "id": job.id,
        "object": "batch",
        "endpoint": job.endpoint,
        "model": None,
        "errors": errors,
        "input_file_id": job.input_file_id,
        "completion_window": _window_text(window_s),
        "status": job.status,
        "output_file_id": files.output_file_id(job.id, errors=False)
        if final and succeeded else None,
        "error_file_id": files.output_file_id(job.id, errors=True)
        if final and unsucceeded else None,
        **{name: view[name] for name in (
            "created_at", "in_progress_at", "expires_at", "completed_at", "failed_at",
            "expired_at", "cancelling_at", "cancelled_at")},
        "finalizing_at": view["finalizing_at"],
        "request_counts": {"total": counts["total"], "completed": succeeded,
                           "failed": unsucceeded},
        "metadata": job.metadata_,
        "usage": {**view["usage"], "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}},
        "queue": job.queue,
        # quotaflow's: when the output and error files go, and whether they are gone.
        "output_expires_at": view["output_expires_at"],
        "deleted": view["deleted"],
    }


def _window_text(seconds: float) -> str:
    whole = round(seconds)
    for unit, size in (("h", 3600), ("m", 60)):
        if whole % size == 0:
            return f"{whole // size}{unit}"
    return f"{whole}s"


"""Anthropic's Message Batches API's view of quotaflow's jobs.

A Message Batch *is* a job whose output is Anthropic's Message Batches results
(`jobs.output_format` "anthropic"): `msgbatch_<hex>` names the job `batch_<hex>`, so
the id needs no table of its own, and a job made by POST /jobs from an Anthropic
file is a Message Batch too. POST /v1/messages/batches goes through quotaflow.ingest.pipeline
like any file (quotaflow/compat/anthropic_batch_body.py hands it the requests as lines), so
quotas, limits, bad lines and routing are the same. The object is Anthropic's:
`processing_status` in_progress, canceling or ended (once no request is open),
`request_counts` as requests finish (Anthropic moves them all at the end), RFC 3339
times, and `results_url` once it has ended.
"""

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select, tuple_
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.budget.caps import check_cap
from quotaflow.compat import openai_batches as batches
from quotaflow.compat import retention
from quotaflow.compat.anthropic_batch_body import BatchBodyError, open_requests
from quotaflow.config import Settings
from quotaflow.constants import OUTPUT_ANTHROPIC
from quotaflow.deployments.catalog import Deployments
from quotaflow.dispatch.queues import Dispatcher
from quotaflow.errors import (
    InputFileError,
    InvalidParameter,
    InvalidRequest,
    JobNotFound,
    ModelNotAllowed,
)
from quotaflow.ingest import pipeline as ingest
from quotaflow.ingest.formats import BETA_NAME
from quotaflow.jobs import tallies
from quotaflow.jobs import view as job_view
from quotaflow.models import ItemStatus, Job, JobStatus, utcnow
from quotaflow.results.output import iter_output
from quotaflow.tenants import audit
from quotaflow.tenants.grants import Allowlist

PREFIX = "msgbatch_"
JOB_PREFIX = "batch_"
# Anthropic's: a batch not done within 24 hours expires (its unsent requests `expired`).
WINDOW_S = 24 * 3600
# Reasons quoted in a refusal (the rest are counted).
REASONS_SHOWN = 5


class MessageBatchNotFound(JobNotFound):
    """No Message Batch has the id for this tenant."""


def batch_id(job_id: str) -> str:
    return PREFIX + job_id.removeprefix(JOB_PREFIX)


def job_id(message_batch_id: str) -> str:
    if not message_batch_id.startswith(PREFIX):
        raise MessageBatchNotFound(f"no message batch with id {message_batch_id!r} (ids "
                                   f"start with {PREFIX!r})")
    return JOB_PREFIX + message_batch_id.removeprefix(PREFIX)


def get_batch(session: Session, message_batch_id: str, tenant: str | None) -> Job:
    """The tenant's job the id names, if its output is Message Batches results and it was
    not deleted (a deleted job's tombstone is for quotaflow's own routes)."""
    job = session.get(Job, job_id(message_batch_id))
    if job is None or job.output_format != OUTPUT_ANTHROPIC or job.deleted_at is not None or (
            tenant is not None and job.tenant != tenant):
        raise MessageBatchNotFound(f"no message batch with id {message_batch_id!r}")
    return job


def create_batch(sessions: sessionmaker[Session], body: bytes, *, tenant: str,
                 settings: Settings, deployments: Deployments, dispatcher: Dispatcher,
                 queue: str | None = None, idempotency_key: str | None = None,
                 anthropic_beta: str | None = None,
                 allow: Allowlist | None = None,
                 actor: audit.Actor | None = None,
                 caps: tuple[int | None, int | None] = (None, None)) -> ingest.Created:
    """Ingest the body's requests as a job with Anthropic output, or refuse it whole
    (BatchBodyError, or ingest's errors) and store nothing. A new job comes with its
    items' counts, which need not be counted again. `anthropic_beta`, the request's
    header, applies to each request that names no betas of its own; `caps`, the batch's
    own max RPM and TPM (X-Quotaflow-Max-Rpm / -Tpm), inside each deployment's budget."""
    spec = ingest.JobSpec(
        queue=batches.choose_queue(queue, None), tenant=tenant,
        idempotency_key=idempotency_key, max_lines=settings.max_message_batch_requests,
        completion_window_s=WINDOW_S, output_format=OUTPUT_ANTHROPIC, allow=allow,
        refuse_disallowed=True, actor=actor, max_rpm=check_cap("X-Quotaflow-Max-Rpm", caps[0]),
        max_tpm=check_cap("X-Quotaflow-Max-Tpm", caps[1]))
    stream = open_requests(body, settings.max_message_batch_requests,
                           beta_names(anthropic_beta))
    try:
        return ingest.create_job(sessions, stream, settings=settings, deployments=deployments,
                                 dispatcher=dispatcher, spec=spec)
    except InputFileError as exc:
        raise _refusal(exc) from None


def beta_names(header: str | None) -> tuple[str, ...]:
    """The betas an anthropic-beta header lists (comma-separated); BatchBodyError for one
    that is not a beta's name."""
    names = tuple(n.strip() for n in (header or "").split(",") if n.strip())
    for name in names:
        if not BETA_NAME.fullmatch(name):
            raise BatchBodyError(f"anthropic-beta: {name[:100]!r} is not a beta's name")
    return names


def _refusal(exc: InputFileError) -> BatchBodyError:
    """Ingest's refusal of the file, naming requests where it names lines (line N is
    requests.N-1: every request is one line)."""
    reasons = [f"requests.{p.line_no - 1}: {p.reason}" for p in exc.problems[:REASONS_SHOWN]]
    if len(exc.problems) > REASONS_SHOWN:
        reasons.append(f"and {len(exc.problems) - REASONS_SHOWN} more")
    if isinstance(exc, ModelNotAllowed):  # its message names a line; the reasons suffice
        return BatchBodyError("; ".join(reasons) + " (nothing of the batch was stored)")
    return BatchBodyError("; ".join([exc.message, *reasons]))


# --- the Message Batch object ----------------------------------------------------------

def item_counts(session: Session, job_ids: list[str]) -> dict[str, dict[str, int]]:
    """Items per status of each job, as kept by the database, for a whole page at once."""
    return {job: tallies.statuses(kept)
            for job, kept in tallies.tallies(session, job_ids).items()}


def request_counts(counts: dict[str, int]) -> dict[str, int]:
    return {
        "processing": sum(counts.get(status, 0) for status in ItemStatus.OPEN),
        "succeeded": counts.get(ItemStatus.SUCCEEDED, 0),
        "errored": counts.get(ItemStatus.FAILED, 0) + counts.get(ItemStatus.SPEND_LIMITED, 0),
        "canceled": counts.get(ItemStatus.CANCELLED, 0),
        "expired": counts.get(ItemStatus.EXPIRED, 0),
    }


def processing_status(job: Job, processing: int) -> str:
    """ended once the job is final and no request is open (an expired job's calls in
    flight still finish); canceling from the cancel until then."""
    if job.status in JobStatus.FINAL and processing == 0:
        return "ended"
    if job.status == JobStatus.CANCELLING or job.cancelling_at is not None:
        return "canceling"
    return "in_progress"


def batch_object(job: Job, counts: dict[str, int], base_url: str) -> dict[str, Any]:
    """Anthropic's Message Batch; `base_url` is where the client reached the API."""
    tallies = request_counts(counts)
    status = processing_status(job, tallies["processing"])
    ended = status == "ended"
    ended_at = job.completed_at or job.cancelled_at or job.expired_at or job.failed_at
    message_batch_id = batch_id(job.id)
    return {
        "id": message_batch_id,
        "type": "message_batch",
        "processing_status": status,
        "request_counts": tallies,
        "ended_at": rfc3339(ended_at) if ended else None,
        "created_at": rfc3339(job.created_at),
        "expires_at": rfc3339(job.expires_at),
        "cancel_initiated_at": rfc3339(job.cancelling_at),
        # Anthropic's archived_at: when its results became unavailable (they expired).
        "archived_at": (rfc3339(job_view.output_expires_at(job))
                        if ended and job_view.results_gone(job, utcnow()) else None),
        "results_url": (f"{base_url.rstrip('/')}/v1/messages/batches/{message_batch_id}/results"
                        if ended else None),
    }


def rfc3339(moment: datetime | None) -> str | None:
    if moment is None:
        return None
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


# --- lists and results -----------------------------------------------------------------

def list_batches(session: Session, tenant: str, *, limit: int, before_id: str | None = None,
                 after_id: str | None = None) -> tuple[list[Job], bool]:
    """A page of the tenant's Message Batches, newest first, and whether more lie beyond it
    (Anthropic's cursors: after_id pages towards older batches, before_id towards newer,
    the page always newest first)."""
    if before_id is not None and after_id is not None:
        raise InvalidParameter("before_id", "give before_id or after_id, not both")
    order = tuple_(Job.created_at, Job.id)
    query = select(Job).where(Job.tenant == tenant, Job.output_format == OUTPUT_ANTHROPIC,
                              Job.deleted_at.is_(None))
    if before_id is not None:
        anchor = _anchor(session, before_id, tenant, "before_id")
        query = query.where(order > tuple_(anchor.created_at, anchor.id)).order_by(
            Job.created_at.asc(), Job.id.asc())
    else:
        if after_id is not None:
            anchor = _anchor(session, after_id, tenant, "after_id")
            query = query.where(order < tuple_(anchor.created_at, anchor.id))
        query = query.order_by(Job.created_at.desc(), Job.id.desc())
    page = list(session.scalars(query.limit(limit + 1)))
    more = len(page) > limit
    page = page[:limit]
    if before_id is not None:
        page.reverse()
    return page, more


def _anchor(session: Session, message_batch_id: str, tenant: str, param: str) -> Job:
    try:
        return get_batch(session, message_batch_id, tenant)
    except MessageBatchNotFound:
        raise InvalidParameter(param, f"{param}: no message batch with id "
                                      f"{message_batch_id!r}") from None


def page_object(session: Session, page: list[Job], has_more: bool,
                base_url: str) -> dict[str, Any]:
    counts = item_counts(session, [job.id for job in page])
    data = [batch_object(job, counts[job.id], base_url) for job in page]
    return {"data": data, "has_more": has_more,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None}


def check_ended(session: Session, job: Job) -> None:
    """Results exist once the batch has ended, as at Anthropic (results_url is null
    before, and the SDK asks for it before it downloads)."""
    retention.require_results(job)  # expired: gone, a 404 naming when
    processing = request_counts(item_counts(session, [job.id])[job.id])["processing"]
    status = processing_status(job, processing)
    if status != "ended":
        raise InvalidRequest(f"message batch {batch_id(job.id)} has not ended yet "
                             f"(processing_status {status}): its results can be read once "
                             "it has")


def result_lines(session: Session, job: Job) -> Iterator[str]:
    """Every request's result line: the succeeded ones, then the others (Anthropic
    promises no order; custom_id says which request a line answers)."""
    yield from iter_output(session, job.id, errors=False)
    yield from iter_output(session, job.id, errors=True)

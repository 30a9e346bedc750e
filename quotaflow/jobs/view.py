"""A job as clients see it: OpenAI's batch object, plus quotaflow's queue and usage.

Every view of a job (REST, /v1, CLI, embedded run) is this one object, so they
all report the same statuses and counts.
"""

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from quotaflow.jobs import tallies
from quotaflow.models import ItemStatus, Job
from quotaflow.tenants.spend import job_cost


def item_counts(session: Session, job_id: str) -> dict[str, int]:
    """Its items per status, as kept by the database (quotaflow/jobs/tallies.py)."""
    return tallies.statuses(tallies.tallies(session, [job_id])[job_id])


def usage_totals(session: Session, job_id: str) -> tuple[int, int]:
    """Its results' prompt and completion tokens, as kept by the database."""
    return tallies.usage(tallies.tallies(session, [job_id])[job_id])


def ended_at(job: Job) -> datetime | None:
    """When the job reached its final status (None while it runs)."""
    return job.completed_at or job.cancelled_at or job.expired_at or job.failed_at


def output_expires_at(job: Job) -> datetime | None:
    """When its output goes: `output_expires_after_s` after the job ended, as OpenAI anchors
    a batch's output expiry on the output file's creation (None: kept, or still running).
    The sweep's SQL (retention.py) is the same sum."""
    end = ended_at(job)
    if end is None or job.output_expires_after_s is None:
        return None
    return end + timedelta(seconds=job.output_expires_after_s)


def results_gone(job: Job, now: datetime) -> bool:
    """Whether its results are gone for readers: deleted, or past their expiry (from that
    moment, even before the sweep has marked the job and removed the rows)."""
    expires = output_expires_at(job)
    return job.deleted_at is not None or (expires is not None and expires <= now)


def _unix(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp())


def job_object(session: Session, job: Job,
               counts: dict[str, int] | None = None) -> dict[str, Any]:
    """The job as OpenAI describes a batch, plus quotaflow's queue.

    `counts` (items per status) are given by ingest for a job it has just made, which
    has no usage yet: counting a million fresh rows again would take seconds."""
    if job.tombstone is not None:  # items and results deleted: as they were then
        counts = job.tombstone["counts"]
        prompt, completion = job.tombstone["usage"]
        cost = job_cost(session, job.id)
    elif counts is None:
        kept = tallies.tallies(session, [job.id])[job.id]
        counts, (prompt, completion) = tallies.statuses(kept), tallies.usage(kept)
        cost = job_cost(session, job.id)
    else:
        prompt = completion = 0
        cost = job_cost(None, job.id)
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
            "failed": counts.get(ItemStatus.FAILED, 0) + counts.get(ItemStatus.SPEND_LIMITED, 0),
            "pending": sum(counts.get(status, 0) for status in ItemStatus.OPEN),
            "cancelled": counts.get(ItemStatus.CANCELLED, 0),
            "expired": counts.get(ItemStatus.EXPIRED, 0),
        },
        "usage": {"input_tokens": prompt, "output_tokens": completion,
                  "total_tokens": prompt + completion},
        # quotaflow's: what its calls cost so far at the deployments' prices (spend.py).
        "cost": cost,
        "stop_reason": job.stop_reason,
        "output_format": job.output_format,
        "metadata": job.metadata_,
        "max_attempts": job.max_attempts,
        **{name: _unix(getattr(job, name)) for name in (
            "created_at", "in_progress_at", "finalizing_at", "completed_at", "failed_at",
            "cancelling_at", "cancelled_at", "expired_at", "expires_at")},
        # Retention (quotaflow/compat/retention.py): when the output goes (None: kept, or the job
        # still runs); whether it is gone (deleted on request, or expired) and when.
        "output_expires_at": _unix(output_expires_at(job)),
        "deleted": job.deleted_at is not None,
        "deleted_at": _unix(job.deleted_at),
    }

"""A job as clients see it: OpenAI's batch object, plus quotaflow's queue and usage.

Every view of a job (REST, /v1, CLI, embedded run) is this one object, so they
all report the same statuses and counts.
"""

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from quotaflow.jobs import tallies
from quotaflow.models import ItemStatus, Job
from quotaflow.tenants.spend import job_cost, job_costs

# session.info's key for figures read ahead by prefetch: job id -> (tallies, cost).
_READ_AHEAD = "quotaflow.job_figures"
_JOBS_AHEAD = "quotaflow.jobs_read_ahead"


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


def prefetch(session: Session, job_ids: Sequence[str]) -> None:
    """Many jobs read at once, in three statements whatever their number: the jobs (into
    the session, where get_job finds them), their tallies and their costs. job_object
    then takes each job's figures from the session (once) instead of asking for them, so
    a page of a list or a round of waiting reads costs three statements, not three a job."""
    ids = list(dict.fromkeys(job_ids))
    if not ids:
        return
    # held here: the session's identity map keeps objects only while something refers to them
    session.info[_JOBS_AHEAD] = session.scalars(select(Job).where(Job.id.in_(ids))).all()
    kept, costs = tallies.tallies(session, ids), job_costs(session, ids)
    session.info.setdefault(_READ_AHEAD, {}).update({job: (kept[job], costs[job])
                                                     for job in ids})


def _read_ahead(session: Session, job_id: str) -> tuple[dict[str, int], dict[str, Any]] | None:
    """The job's tallies and cost if prefetch read them in this session (taken once)."""
    ahead = session.info.get(_READ_AHEAD)
    return None if ahead is None else ahead.pop(job_id, None)


def job_object(session: Session, job: Job,
               counts: dict[str, int] | None = None) -> dict[str, Any]:
    """The job as OpenAI describes a batch, plus quotaflow's queue.

    `counts` (items per status) are given by ingest for a job it has just made, which
    has no usage yet: counting a million fresh rows again would take seconds."""
    if job.tombstone is not None:  # items and results deleted: as they were then
        counts = job.tombstone["counts"]
        prompt, completion = job.tombstone["usage"]
        ahead = _read_ahead(session, job.id)
        cost = ahead[1] if ahead else job_cost(session, job.id)
    elif counts is None:
        kept, cost = _read_ahead(session, job.id) or (
            tallies.tallies(session, [job.id])[job.id], job_cost(session, job.id))
        counts, (prompt, completion) = tallies.statuses(kept), tallies.usage(kept)
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

"""Answers reused across jobs: a request identical to one an earlier job of the same
tenant already got a successful answer for takes that answer instead of calling the
provider again.

Off by default (QUOTAFLOW_DEDUP_ACROSS_JOBS): a cache of answers suits
deterministic requests (temperature 0, embeddings), not sampling. Within one
job, identical requests are shared at ingest instead (jobs.py, leases.py).
"""

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.models import Item, Job, Result
from quotaflow.providers.outcomes import Shared
from quotaflow.results.leases import ClaimedItem

# Earlier answers looked at per batch: enough to find one per request, bounded.
LOOKUP_LIMIT = 1000


def earlier_answers(sessions: sessionmaker[Session], job_id: str, tenant: str,
                    items: list[ClaimedItem], output_format: str = "openai"
                    ) -> dict[int, Shared]:
    """Line number -> a successful answer to the same request from another job of the
    tenant's (never another tenant's: an answer is data) stored in the same output
    format (an OpenAI chat.completion is no Anthropic Message)."""
    hashes = {item.body_hash for item in items if item.body_hash}
    if not hashes:
        return {}
    with sessions() as session:
        rows = session.execute(
            select(Item.body_hash, Result.job_id, Result.custom_id, Result.request_id,
                   Result.status_code, Result.response, Result.shared_from)
            .join(Result, (Result.job_id == Item.job_id) & (Result.line_no == Item.line_no))
            .join(Job, Job.id == Item.job_id)
            .where(Item.body_hash.in_(hashes), Item.job_id != job_id, Job.tenant == tenant,
                   Job.output_format == output_format,
                   Result.error.is_(None), Result.status_code.is_not(None))
            .limit(LOOKUP_LIMIT)).all()
    found: dict[str, Shared] = {}
    for digest, batch_id, custom_id, request_id, status, response, shared_from in rows:
        source = shared_from or {"id": request_id, "custom_id": custom_id,
                                 "batch_id": batch_id}
        found.setdefault(digest, Shared(status, response, source))
    return {item.line_no: found[item.body_hash] for item in items
            if item.body_hash in found}

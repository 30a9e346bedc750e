"""What a job's batches all need to know of it, read once per worker process.

None of it changes after the job is created, so a batch run reads it from memory,
not from the database; the hooks a run gets (policies/) are chosen from it too.
"""

from dataclasses import dataclass

from sqlalchemy import exists, func, select
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.models import Item, Job, Tenant

# Jobs whose facts a worker process keeps (the oldest read is forgotten first).
JOB_FACTS_KEPT = 1024


@dataclass(frozen=True)
class JobFacts:
    url: str
    queue: str
    max_attempts: int | None
    tenant: str
    has_duplicates: bool  # some items wait for an identical line's answer
    output_format: str  # "openai" or "anthropic": the shape its answers are stored in
    weight: float  # its tenant's weight in fair shares of a budget (quotaflow/budget/fair_share.py)


class JobFactsCache:
    """JobFacts by job id, the JOB_FACTS_KEPT most recently read."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions
        self._jobs: dict[str, JobFacts] = {}

    def get(self, job_id: str) -> JobFacts:
        facts = self._jobs.get(job_id)
        if facts is None:
            twins = exists().where(Item.job_id == job_id, Item.duplicate_of.is_not(None))
            with self.sessions() as session:
                row = session.execute(
                    select(Job.endpoint, Job.queue, Job.max_attempts, Job.tenant,
                           twins.label("twins"), Job.output_format,
                           func.coalesce(Tenant.weight, 1.0))
                    .outerjoin(Tenant, Tenant.name == Job.tenant)
                    .where(Job.id == job_id)).one()
            if len(self._jobs) >= JOB_FACTS_KEPT:
                self._jobs.pop(next(iter(self._jobs)))
            facts = self._jobs[job_id] = JobFacts(*row)
        return facts

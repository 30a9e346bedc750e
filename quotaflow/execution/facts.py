"""What a job's batches all need to know of it, read once per worker process.

None of it changes after the job is created (its tenant's caps are read with it: a
change of those reaches the jobs a worker has not read yet), so a batch run reads it
from memory, not from the database; the hooks a run gets (policies/) are chosen from it too.
"""

from dataclasses import dataclass

from sqlalchemy import exists, func, select
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.budget.caps import caps_of
from quotaflow.deployments.limits import Cap
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
    # Its tenant's and its own RPM/TPM caps inside each budget (quotaflow/budget/caps.py).
    caps: tuple[Cap, ...] = ()


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
                           func.coalesce(Tenant.weight, 1.0), Tenant.max_rpm, Tenant.max_tpm,
                           Job.max_rpm, Job.max_tpm)
                    .outerjoin(Tenant, Tenant.name == Job.tenant)
                    .where(Job.id == job_id)).one()
            if len(self._jobs) >= JOB_FACTS_KEPT:
                self._jobs.pop(next(iter(self._jobs)))
            *known, tenant_rpm, tenant_tpm, job_rpm, job_tpm = row
            caps = caps_of(row.tenant, tenant_rpm, tenant_tpm, job_id, job_rpm, job_tpm)
            url, queue, attempts, tenant, twins_, output_format, weight = known
            facts = self._jobs[job_id] = JobFacts(url, queue, attempts, tenant, twins_,
                                                  output_format, weight, caps)
        return facts

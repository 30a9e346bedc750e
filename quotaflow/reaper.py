"""The reaper: gives the items of dead workers back to the queue.

A worker killed outright (SIGKILL of the whole process, a lost machine) leaves
its claimed items `running` under a lease nobody will renew, and its unacked
Celery message only comes back after Redis's visibility timeout (an hour by
default). Once a lease has run out, the reaper returns those items to
`pending` and dispatches new batch messages for them, so the job finishes
minutes, not hours, later. A message that arrives twice is harmless: claims
are conditional and results insert-or-ignore.
"""

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.jobs import Dispatcher, batch_refs
from quotaflow.models import Item, ItemStatus, Job, JobStatus, utcnow

REAP_LIMIT = 10_000


def reap_expired_leases(sessions: sessionmaker[Session], dispatcher: Dispatcher,
                        batch_size: int) -> int:
    """Return expired claims to pending and queue them again; how many items were reaped."""
    now = utcnow()
    with sessions.begin() as session:
        expired = (select(Item.job_id, Item.line_no)
                   .join(Job, Job.id == Item.job_id)
                   .where(Item.status == ItemStatus.RUNNING, Item.lease_expires_at < now,
                          Job.status == JobStatus.IN_PROGRESS)
                   .limit(REAP_LIMIT))
        rows = session.execute(expired).all()
        by_job: dict[str, list[int]] = {}
        for job_id, line_no in rows:
            by_job.setdefault(job_id, []).append(line_no)
        reaped: dict[str, list[int]] = {}
        for job_id, lines in by_job.items():
            returned = session.execute(
                update(Item)
                .where(Item.job_id == job_id, Item.line_no.in_(lines),
                       Item.status == ItemStatus.RUNNING, Item.lease_expires_at < now)
                .values(status=ItemStatus.PENDING, lease_owner=None, lease_expires_at=None)
                .returning(Item.line_no)).scalars().all()
            if returned:
                reaped[job_id] = sorted(returned)
        queues = dict(session.execute(select(Job.id, Job.queue)
                                      .where(Job.id.in_(list(reaped)))).all())
    # Dispatch after the commit: a worker must find the items pending when it claims.
    for job_id, lines in reaped.items():
        dispatcher.dispatch(queues[job_id], batch_refs(job_id, lines, batch_size))
    return sum(len(lines) for lines in reaped.values())

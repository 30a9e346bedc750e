"""Dispatch that tells the fair shares a tenant's batches are waiting for a worker.

Celery takes a queue's messages in order, so a tenant that submits after another
has queued thousands of batches would wait behind all of them. Marking the tenant as
waiting (quotaflow/budget/fair_share.py) makes the others' batches hand their slots back
until a worker reaches one of its batches. Realtime batches have workers of their
own (docs/concepts/queues.md) and are not marked; nor are a local
deployment's (their workers take no other queue).
"""

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.budget.fair_share import FairShare
from quotaflow.constants import QUEUE_BULK, QUEUE_STANDARD
from quotaflow.dispatch.queues import BatchRef, Dispatcher
from quotaflow.errors import ServiceUnavailable
from quotaflow.models import Job


class MarkingDispatcher:
    """Wraps a Dispatcher: after the batches are sent, their tenants are marked waiting."""

    def __init__(self, inner: Dispatcher, sessions: sessionmaker[Session],
                 fair: FairShare) -> None:
        self._inner = inner
        self._sessions = sessions
        self._fair = fair

    def dispatch(self, queue: str, batches: list[BatchRef]) -> None:
        self._inner.dispatch(queue, batches)
        if queue not in (QUEUE_STANDARD, QUEUE_BULK) or not batches:
            return  # realtime and local deployments' queues have workers of their own
        job_ids = list({ref.job_id for ref in batches})
        with self._sessions() as session:
            tenants = set(session.scalars(select(Job.tenant).where(Job.id.in_(job_ids))))
        try:
            for tenant in tenants:
                self._fair.queued(tenant)
        except ServiceUnavailable:
            pass  # the batches are queued; only their place in line is not kept

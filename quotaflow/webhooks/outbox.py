"""The outbox: ended jobs become deliveries, deliveries are claimed, attempts recorded.

Three short transactions, none on a batch's path and none held while a request is out:

- sweep: jobs in a final status that are not yet notified (`jobs.notified_at IS NULL`,
  a partial index) become one delivery per endpoint of their tenant that wants the event,
  and are marked notified, in one transaction. Rows are locked with SKIP LOCKED, so
  several workers sweep at once without making an event twice.
- claim: due deliveries (SKIP LOCKED again) get their next_attempt_at moved a lease into
  the future, which is what makes them this worker's; a worker killed mid-attempt leaves
  a claim that lapses, and another worker sends the delivery (at least once).
- record: the attempt is stored, and the delivery is delivered (2xx), due again after
  the schedule's next delay, or failed when the schedule is spent.
"""

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from quotaflow import store
from quotaflow.jobs.view import job_object
from quotaflow.models import Job, JobStatus, utcnow
from quotaflow.webhooks import EVENT_BY_STATUS
from quotaflow.webhooks.webhook_tables import (
    DeliveryStatus,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
)

SWEEP_LIMIT = 100


@dataclass(frozen=True)
class Claim:
    """A delivery this worker is to attempt now."""

    id: str
    endpoint_id: str
    url: str
    body: str
    attempt_no: int


@dataclass(frozen=True)
class Outcome:
    """What one attempt got: the endpoint's status code, or why there was none."""

    status_code: int | None
    error: str | None
    duration_ms: int

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def event_body(session: Session, job: Job, event_id: str, event_type: str) -> str:
    """The event as OpenAI's webhooks shape it, with the batch object as its data."""
    ended = getattr(job, f"{job.status}_at", None) or utcnow()
    event = {"object": "event", "id": event_id, "type": event_type,
             "created_at": int(ended.timestamp()), "data": job_object(session, job)}
    return json.dumps(event, separators=(",", ":"))


def sweep(sessions: sessionmaker[Session], first_delay_s: float) -> int:
    """Turn jobs that ended since the last sweep into deliveries; how many deliveries."""
    now = utcnow()
    with sessions.begin() as session:
        ended = list(session.scalars(
            select(Job).where(Job.notified_at.is_(None), Job.status.in_(JobStatus.FINAL))
            .order_by(Job.created_at).limit(SWEEP_LIMIT).with_for_update(skip_locked=True)))
        if not ended:
            return 0
        endpoints: dict[str, list[WebhookEndpoint]] = {}
        for endpoint in session.scalars(select(WebhookEndpoint).where(
                WebhookEndpoint.tenant.in_({job.tenant for job in ended}))):
            endpoints.setdefault(endpoint.tenant, []).append(endpoint)
        rows = []
        for job in ended:
            event_type = EVENT_BY_STATUS[job.status]
            targets = [e for e in endpoints.get(job.tenant, ()) if event_type in e.events]
            if not targets:
                continue
            event_id = f"evt_{uuid.uuid4().hex}"
            body = event_body(session, job, event_id, event_type)
            rows += [{"id": f"msg_{uuid.uuid4().hex}", "endpoint_id": endpoint.id,
                      "tenant": job.tenant, "job_id": job.id, "event_id": event_id,
                      "event_type": event_type, "body": body,
                      "status": DeliveryStatus.PENDING, "attempts": 0,
                      "next_attempt_at": now + timedelta(seconds=first_delay_s),
                      "created_at": now} for endpoint in targets]
        if rows:
            session.execute(store.of(session).insert_ignore(WebhookDelivery.__table__), rows)
        session.execute(update(Job).where(Job.id.in_([job.id for job in ended]))
                        .values(notified_at=now))
    return len(rows)


def claim_due(sessions: sessionmaker[Session], lease_s: float, limit: int) -> list[Claim]:
    """Up to `limit` deliveries whose attempt is due, made this worker's for `lease_s`."""
    now = utcnow()
    with sessions.begin() as session:
        due = session.execute(
            select(WebhookDelivery.id, WebhookDelivery.endpoint_id, WebhookDelivery.body,
                   WebhookDelivery.attempts)
            .where(WebhookDelivery.status == DeliveryStatus.PENDING,
                   WebhookDelivery.next_attempt_at <= now)
            .order_by(WebhookDelivery.next_attempt_at).limit(limit)
            .with_for_update(skip_locked=True)).all()
        if not due:
            return []
        session.execute(update(WebhookDelivery)
                        .where(WebhookDelivery.id.in_([row.id for row in due]))
                        .values(next_attempt_at=now + timedelta(seconds=lease_s)))
        urls = dict(session.execute(select(WebhookEndpoint.id, WebhookEndpoint.url).where(
            WebhookEndpoint.id.in_({row.endpoint_id for row in due}))).all())
    return [Claim(row.id, row.endpoint_id, urls[row.endpoint_id], row.body, row.attempts + 1)
            for row in due]


def record(sessions: sessionmaker[Session], claim: Claim, outcome: Outcome,
           schedule: Sequence[float]) -> str:
    """Store the attempt and move the delivery on; its status after it."""
    now = utcnow()
    with sessions.begin() as session:
        delivery = session.scalars(select(WebhookDelivery).where(
            WebhookDelivery.id == claim.id).with_for_update()).one_or_none()
        if delivery is None:  # its endpoint was removed meanwhile
            return DeliveryStatus.FAILED
        if delivery.status != DeliveryStatus.PENDING or delivery.attempts >= claim.attempt_no:
            return delivery.status  # another worker recorded this attempt (lapsed claim)
        started = now - timedelta(milliseconds=outcome.duration_ms)
        session.execute(store.of(session).insert_ignore(WebhookAttempt.__table__).values(
            delivery_id=claim.id, attempt_no=claim.attempt_no, attempted_at=started,
            status_code=outcome.status_code, error=(outcome.error or None) and outcome.error[:500],
            duration_ms=outcome.duration_ms))
        delivery.attempts = claim.attempt_no
        if outcome.ok:
            delivery.status, delivery.delivered_at = DeliveryStatus.DELIVERED, now
            delivery.next_attempt_at = None
        elif claim.attempt_no < len(schedule):
            delivery.next_attempt_at = now + timedelta(seconds=schedule[claim.attempt_no])
        else:
            delivery.status, delivery.next_attempt_at = DeliveryStatus.FAILED, None
        return delivery.status

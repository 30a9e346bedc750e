"""A tenant's webhook endpoints, and the deliveries made to them, as clients see them.

An endpoint is checked before it is stored (its events known, its URL one quotaflow may
send to: guard.py) and its signing secret is returned once, by create_endpoint, never
again: it is not stored, only derived (signing.py). Every read is for one tenant:
another tenant's endpoint is "not found", as its jobs are.
"""

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.config import Settings
from quotaflow.errors import InvalidParameter, InvalidRequest, NotFound
from quotaflow.models import utcnow
from quotaflow.tenants import audit
from quotaflow.webhooks import EVENT_TYPES, guard, signing
from quotaflow.webhooks.webhook_tables import WebhookAttempt, WebhookDelivery, WebhookEndpoint

# Each job's end fans out to every matching endpoint: a bound on the work one tenant
# can ask of the delivery loop (Stripe allows 16 endpoints per account).
MAX_ENDPOINTS = 20


class EndpointNotFound(NotFound):
    """No webhook endpoint has the given id for this tenant."""


def parse_events(events: Sequence[str] | None) -> list[str]:
    """The events asked for, known and without repeats; all of them when none is given."""
    if events is None:
        return list(EVENT_TYPES)
    if isinstance(events, str) or not all(isinstance(name, str) for name in events):
        raise InvalidParameter("events", "events must be a list of event names")
    chosen = list(dict.fromkeys(name.strip() for name in events if name.strip()))
    if not chosen:
        raise InvalidParameter("events", f"events is empty; choose from {', '.join(EVENT_TYPES)}")
    unknown = [name for name in chosen if name not in EVENT_TYPES]
    if unknown:
        raise InvalidParameter("events", f"unknown event {unknown[0]!r}; the events are "
                                         f"{', '.join(EVENT_TYPES)}")
    return chosen


def create_endpoint(sessions: sessionmaker[Session], settings: Settings, tenant: str,
                    url: str, events: Sequence[str] | None,
                    actor: audit.Actor | None = None) -> tuple[WebhookEndpoint, str]:
    """Store a new endpoint; it and its signing secret (shown this once)."""
    chosen = parse_events(events)
    guard.resolve(url, settings.webhook_allowed_networks)
    signing.master_key(settings.webhook_secret_key)  # refused before anything is stored
    endpoint = WebhookEndpoint(id=f"we_{uuid.uuid4().hex[:24]}", tenant=tenant, url=url,
                               events=chosen, created_at=utcnow())
    with sessions.begin() as session:
        count = session.scalar(select(func.count()).select_from(WebhookEndpoint)
                               .where(WebhookEndpoint.tenant == tenant)) or 0
        if count >= MAX_ENDPOINTS:
            raise InvalidRequest(f"tenant {tenant} already has {count} webhook endpoints, the "
                                 f"most allowed; remove one first (`quotaflow webhooks remove`)")
        session.add(endpoint)
        audit.record(session, actor, "create", "webhook", endpoint.id)
    return endpoint, signing.endpoint_secret(settings.webhook_secret_key, endpoint.id)


def get_endpoint(session: Session, endpoint_id: str, tenant: str) -> WebhookEndpoint:
    endpoint = session.get(WebhookEndpoint, endpoint_id)
    if endpoint is None or endpoint.tenant != tenant:
        raise EndpointNotFound(f"no webhook endpoint with id {endpoint_id!r}")
    return endpoint


def list_endpoints(session: Session, tenant: str) -> list[WebhookEndpoint]:
    return list(session.scalars(select(WebhookEndpoint).where(WebhookEndpoint.tenant == tenant)
                                .order_by(WebhookEndpoint.created_at, WebhookEndpoint.id)))


def remove_endpoint(sessions: sessionmaker[Session], endpoint_id: str, tenant: str,
                    actor: audit.Actor | None = None) -> None:
    """Remove the endpoint with its deliveries: what was not sent yet never will be."""
    with sessions.begin() as session:
        get_endpoint(session, endpoint_id, tenant)
        audit.record(session, actor, "delete", "webhook", endpoint_id)
        session.execute(delete(WebhookEndpoint).where(WebhookEndpoint.id == endpoint_id))


def list_deliveries(session: Session, tenant: str, endpoint_id: str | None = None,
                    limit: int = 20) -> list[dict[str, Any]]:
    """The newest deliveries of the tenant (or of one of its endpoints), each with its
    attempts in order."""
    query = (select(WebhookDelivery).where(WebhookDelivery.tenant == tenant)
             .order_by(WebhookDelivery.created_at.desc(), WebhookDelivery.id.desc())
             .limit(limit))
    if endpoint_id is not None:
        get_endpoint(session, endpoint_id, tenant)
        query = query.where(WebhookDelivery.endpoint_id == endpoint_id)
    deliveries = list(session.scalars(query))
    attempts: dict[str, list[WebhookAttempt]] = {row.id: [] for row in deliveries}
    for attempt in session.scalars(
            select(WebhookAttempt).where(WebhookAttempt.delivery_id.in_(list(attempts)))
            .order_by(WebhookAttempt.delivery_id, WebhookAttempt.attempt_no)):
        attempts[attempt.delivery_id].append(attempt)
    return [delivery_object(row, attempts[row.id]) for row in deliveries]


def _unix(moment: datetime | None) -> int | None:
    return None if moment is None else int(moment.timestamp())


def endpoint_object(endpoint: WebhookEndpoint) -> dict[str, Any]:
    return {"id": endpoint.id, "object": "webhook_endpoint", "url": endpoint.url,
            "events": list(endpoint.events), "created_at": _unix(endpoint.created_at)}


def delivery_object(row: WebhookDelivery, attempts: list[WebhookAttempt]) -> dict[str, Any]:
    return {
        "id": row.id, "object": "webhook_delivery", "endpoint_id": row.endpoint_id,
        "event_id": row.event_id, "type": row.event_type, "job_id": row.job_id,
        "status": row.status, "created_at": _unix(row.created_at),
        "delivered_at": _unix(row.delivered_at),
        "next_attempt_at": _unix(row.next_attempt_at) if row.status == "pending" else None,
        "attempts": [{"attempt": a.attempt_no,
                      "attempted_at": round(a.attempted_at.timestamp(), 3),
                      "status_code": a.status_code, "error": a.error,
                      "duration_ms": a.duration_ms} for a in attempts],
    }

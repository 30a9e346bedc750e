"""The audit log: who created, cancelled, retried or deleted what, when, from where.

Each row is written in the transaction of the action it records, so an action that
rolled back left no row and a row always means the action happened. Actions are rare
beside reads (a job's creation, not its lines; a key's rotation, not its requests), so a
row each costs nothing the request would notice. Rows older than
QUOTAFLOW_RESULT_RETENTION_S are pruned by the workers' retention sweep
(quotaflow/compat/retention.py), a bounded delete at a time.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, delete, select
from sqlalchemy.orm import Session

from quotaflow.models import AuditEvent, utcnow

# Rows removed per statement of a prune: a short transaction, however many are due.
PRUNE_BATCH = 5000


@dataclass(frozen=True, slots=True)
class Actor:
    """Who acts: the key (None for the operator's CLI, which uses none), its tenant, and
    the client's address ("cli" for a command run on the database)."""

    tenant: str
    key_id: str | None = None
    client: str | None = None


# `quotaflow keys`, run by an operator on the database: no key acts; each row takes the
# tenant of the key it made, rotated or revoked.
OPERATOR_CLI = Actor("", None, "cli")


def record(session: Session, actor: Actor | None, action: str, object_type: str,
           object_id: str, tenant: str | None = None) -> None:
    """One row, in the caller's transaction; nothing when no actor is given (an internal
    caller, such as `quotaflow run` or the sweep). `tenant`: the object's, where it is
    not the actor's (an operator acting on another tenant's key)."""
    if actor is None:
        return
    session.add(AuditEvent(at=utcnow(), tenant=tenant or actor.tenant, key_id=actor.key_id,
                           action=action, object_type=object_type, object_id=object_id,
                           client=(actor.client or "")[:64] or None))


def events(session: Session, *, tenant: str | None, limit: int = 100,
           before: int | None = None) -> list[AuditEvent]:
    """The newest events first (of one tenant, or every tenant's for None); `before`: an
    event id, the page after the one that ended there."""
    query = select(AuditEvent).order_by(AuditEvent.id.desc()).limit(limit)
    if tenant is not None:
        query = query.where(AuditEvent.tenant == tenant)
    if before is not None:
        query = query.where(AuditEvent.id < before)
    return list(session.scalars(query))


def event_object(row: AuditEvent) -> dict[str, Any]:
    return {"id": row.id, "object": "audit_event", "at": int(row.at.timestamp()),
            "tenant": row.tenant, "key_id": row.key_id, "action": row.action,
            "object_type": row.object_type, "object_id": row.object_id,
            "client": row.client}


def prune(session: Session, kept_s: int, now: datetime | None = None) -> int:
    """Remove up to PRUNE_BATCH events older than `kept_s` seconds (0: kept for ever)."""
    if kept_s <= 0:
        return 0
    cutoff = (now or utcnow()) - timedelta(seconds=kept_s)
    oldest = select(AuditEvent.id).where(AuditEvent.at < cutoff).order_by(
        AuditEvent.id).limit(PRUNE_BATCH)
    done = cast("CursorResult[Any]",
                session.execute(delete(AuditEvent).where(AuditEvent.id.in_(oldest))))
    return done.rowcount or 0

"""The webhook tables: endpoints, the outbox of deliveries, and every attempt made.

A delivery is one event for one endpoint: its body is written once, when the sweep makes
it, so every attempt sends the same bytes under the same `webhook-id` (receivers drop a
repeat by that id). No secret is stored anywhere: an endpoint's is derived from the
master key in the environment (signing.py).
"""

from datetime import datetime

from sqlalchemy import ForeignKey, Index, Integer, String, Text, UniqueConstraint, text
from sqlalchemy.orm import Mapped, mapped_column

from quotaflow.models import Base, JsonType, utcnow


class DeliveryStatus:
    PENDING = "pending"        # an attempt is due at next_attempt_at (or one is under way)
    DELIVERED = "delivered"    # an attempt got a 2xx
    FAILED = "failed"          # every attempt of the retry schedule failed


class WebhookEndpoint(Base):
    """A URL of a tenant's that hears the events it subscribed to."""

    __tablename__ = "webhook_endpoints"
    __table_args__ = (Index("ix_webhook_endpoints_tenant", "tenant", "created_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64))
    url: Mapped[str] = mapped_column(String(2048))
    events: Mapped[list[str]] = mapped_column(JsonType)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


PENDING = "status = 'pending'"


class WebhookDelivery(Base):
    """One event for one endpoint, until a 2xx or the end of the retry schedule."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        # The sweep makes a job's events once; this makes a second sweep harmless too.
        UniqueConstraint("endpoint_id", "event_id", name="uq_webhook_deliveries_event"),
        # The loop's question (what is due?) among the pending deliveries alone.
        Index("ix_webhook_deliveries_due", "next_attempt_at",
              postgresql_where=text(PENDING), sqlite_where=text(PENDING)),
        Index("ix_webhook_deliveries_tenant", "tenant", "created_at"),
    )

    # msg_...: sent as `webhook-id`, the same on every attempt.
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    endpoint_id: Mapped[str] = mapped_column(
        ForeignKey("webhook_endpoints.id", ondelete="CASCADE"), index=True)
    tenant: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[str] = mapped_column(String(64))
    event_id: Mapped[str] = mapped_column(String(64))
    event_type: Mapped[str] = mapped_column(String(32))
    # The event as sent, byte for byte on every attempt.
    body: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default=DeliveryStatus.PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # Pending: when the next attempt is due; while one is under way, when its claim lapses
    # (a worker killed mid-attempt leaves it to another). None once it is over.
    next_attempt_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    delivered_at: Mapped[datetime | None]


class WebhookAttempt(Base):
    """One try of a delivery: when, what the endpoint answered (or why it could not), how long."""

    __tablename__ = "webhook_attempts"

    delivery_id: Mapped[str] = mapped_column(
        ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), primary_key=True)
    attempt_no: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    attempted_at: Mapped[datetime]
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(String(500))
    duration_ms: Mapped[int] = mapped_column(Integer)

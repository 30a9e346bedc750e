"""Webhooks: endpoints, the outbox of deliveries, their attempts, and jobs.notified_at.

Jobs that have already ended are marked notified, so that the first sweep does not send
events for every job ever run; jobs still running are left to notify when they end.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-23
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FINAL = "status IN ('completed', 'failed', 'expired', 'cancelled')"
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
STAMP = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column("jobs", sa.Column("notified_at", STAMP, nullable=True))
    op.execute(f"UPDATE jobs SET notified_at = CURRENT_TIMESTAMP WHERE {FINAL}")
    op.create_index("ix_jobs_unnotified", "jobs", ["status"],
                    postgresql_where=sa.text("notified_at IS NULL"),
                    sqlite_where=sa.text("notified_at IS NULL"))
    op.create_table(
        "webhook_endpoints",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("url", sa.String(2048), nullable=False),
        sa.Column("events", JSON, nullable=False),
        sa.Column("created_at", STAMP, nullable=False),
    )
    op.create_index("ix_webhook_endpoints_tenant", "webhook_endpoints",
                    ["tenant", "created_at"])
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("endpoint_id", sa.String(64),
                  sa.ForeignKey("webhook_endpoints.id", ondelete="CASCADE"), nullable=False),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("event_id", sa.String(64), nullable=False),
        sa.Column("event_type", sa.String(32), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", STAMP, nullable=True),
        sa.Column("created_at", STAMP, nullable=False),
        sa.Column("delivered_at", STAMP, nullable=True),
        sa.UniqueConstraint("endpoint_id", "event_id", name="uq_webhook_deliveries_event"),
    )
    op.create_index("ix_webhook_deliveries_due", "webhook_deliveries", ["next_attempt_at"],
                    postgresql_where=sa.text("status = 'pending'"),
                    sqlite_where=sa.text("status = 'pending'"))
    op.create_index("ix_webhook_deliveries_tenant", "webhook_deliveries",
                    ["tenant", "created_at"])
    op.create_index("ix_webhook_deliveries_endpoint_id", "webhook_deliveries", ["endpoint_id"])
    op.create_table(
        "webhook_attempts",
        sa.Column("delivery_id", sa.String(64),
                  sa.ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("attempt_no", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("attempted_at", STAMP, nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.String(500), nullable=True),
        sa.Column("duration_ms", sa.Integer(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("webhook_attempts")
    op.drop_table("webhook_deliveries")
    op.drop_table("webhook_endpoints")
    op.drop_index("ix_jobs_unnotified", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("notified_at")

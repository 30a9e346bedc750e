"""Jobs, items and results.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("queue", sa.String(16), nullable=False),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("input_filename", sa.String(255)),
        sa.Column("total", sa.Integer, nullable=False),
        sa.Column("metadata", JSON),
        sa.Column("created_at", TS, nullable=False),
        *(sa.Column(name, TS) for name in (
            "in_progress_at", "finalizing_at", "completed_at", "failed_at",
            "cancelling_at", "cancelled_at", "expired_at", "expires_at",
        )),
    )
    op.create_index("ix_jobs_status", "jobs", ["status"])
    op.create_table(
        "items",
        sa.Column("job_id", sa.String(64), sa.ForeignKey("jobs.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("line_no", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("custom_id", sa.String(512)),
        sa.Column("body", JSON),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("lease_owner", sa.String(64)),
        sa.Column("lease_expires_at", TS),
        sa.UniqueConstraint("job_id", "custom_id", name="uq_items_job_custom_id"),
    )
    op.create_index("ix_items_job_status", "items", ["job_id", "status"])
    op.create_table(
        "results",
        sa.Column("job_id", sa.String(64), sa.ForeignKey("jobs.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("line_no", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("custom_id", sa.String(512)),
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("status_code", sa.Integer),
        sa.Column("response", JSON),
        sa.Column("error", JSON),
        sa.Column("prompt_tokens", sa.Integer, nullable=False),
        sa.Column("completion_tokens", sa.Integer, nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("results")
    op.drop_table("items")
    op.drop_table("jobs")

"""Prices and spend: a ledger of what each job's calls cost per deployment and month,
tenants' monthly spend limits, and why a job stopped sending.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-23
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "spend",
        sa.Column("job_id", sa.String(64), primary_key=True),
        sa.Column("deployment", sa.String(255), primary_key=True),
        sa.Column("month", sa.String(7), primary_key=True),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cached_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost", sa.Numeric(24, 9), nullable=True),
        sa.Column("currency", sa.String(3), nullable=True),
    )
    op.create_index("ix_spend_tenant_month", "spend", ["tenant", "month"])
    op.add_column("tenants", sa.Column("max_monthly_spend", sa.Numeric(18, 6), nullable=True))
    op.add_column("jobs", sa.Column("stop_reason", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("stop_reason")
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("max_monthly_spend")
    op.drop_index("ix_spend_tenant_month", "spend")
    op.drop_table("spend")

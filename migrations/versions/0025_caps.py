"""Caps inside the shared budget: tenants.max_rpm / max_tpm for all of a tenant's jobs,
jobs.max_rpm / max_tpm for one job (requests and tokens per minute, per deployment
budget; NULL: no cap). The limiter keeps them as buckets of their own beside each
deployment's (quotaflow/budget/caps.py); nothing else reads them.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("tenants", "jobs")


def upgrade() -> None:
    for table in TABLES:
        op.add_column(table, sa.Column("max_rpm", sa.BigInteger(), nullable=True))
        op.add_column(table, sa.Column("max_tpm", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    for table in TABLES:
        op.drop_column(table, "max_tpm")
        op.drop_column(table, "max_rpm")

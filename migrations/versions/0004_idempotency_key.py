"""Jobs remember the Idempotency-Key they were created with, unique per tenant.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("idempotency_key", sa.String(255)))
    # NULLs are distinct: jobs made without a key never collide.
    op.create_index("uq_jobs_tenant_idempotency_key", "jobs", ["tenant", "idempotency_key"],
                    unique=True)


def downgrade() -> None:
    op.drop_index("uq_jobs_tenant_idempotency_key", "jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("idempotency_key")

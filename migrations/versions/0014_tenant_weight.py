"""A tenant's weight in fair shares of a deployment's budget (quotaflow/budget/fair_share.py).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-23
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Every tenant so far shares equally: weight 1.
    op.add_column("tenants", sa.Column("weight", sa.Float(), nullable=False,
                                       server_default="1"))


def downgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("weight")

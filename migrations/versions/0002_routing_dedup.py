"""Per-job retry limits and shared identical requests.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("max_attempts", sa.Integer))
    op.add_column("items", sa.Column("body_hash", sa.String(64)))
    op.add_column("items", sa.Column("duplicate_of", sa.Integer))
    op.add_column("results", sa.Column("shared_from", JSON))
    op.create_index("ix_items_body_hash", "items", ["body_hash"])
    op.create_index("ix_items_job_duplicate_of", "items", ["job_id", "duplicate_of"])


def downgrade() -> None:
    op.drop_index("ix_items_job_duplicate_of", "items")
    op.drop_index("ix_items_body_hash", "items")
    op.drop_column("results", "shared_from")
    op.drop_column("items", "duplicate_of")
    op.drop_column("items", "body_hash")
    op.drop_column("jobs", "max_attempts")

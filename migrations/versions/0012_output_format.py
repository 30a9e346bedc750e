"""A job's output format: OpenAI batch output lines, or Anthropic Message Batches results.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-23
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Jobs made before Anthropic output existed wrote OpenAI lines: the default says so.
    op.add_column("jobs", sa.Column("output_format", sa.String(16), nullable=False,
                                    server_default="openai"))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("output_format")

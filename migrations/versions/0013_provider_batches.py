"""Provider batches (OpenAI's Batch API, Anthropic's Message Batches) and their lines.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-23
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

STAMP = sa.DateTime(timezone=True)
DUE = "state IN ('uploading', 'submitted', 'collecting')"
QUEUED = "state = 'queued'"


def upgrade() -> None:
    op.create_table(
        "provider_batches",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("deployment", sa.String(255), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("lines", sa.Integer(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("provider_id", sa.String(255), nullable=True),
        sa.Column("input_file_id", sa.String(255), nullable=True),
        sa.Column("provider_status", sa.String(32), nullable=True),
        sa.Column("cancel_reason", sa.String(16), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", STAMP, nullable=False),
        sa.Column("submitted_at", STAMP, nullable=True),
        sa.Column("ended_at", STAMP, nullable=True),
        sa.Column("next_poll_at", STAMP, nullable=False),
    )
    op.create_index("ix_provider_batches_job_id", "provider_batches", ["job_id"])
    op.create_index("ix_provider_batches_due", "provider_batches", ["next_poll_at"],
                    postgresql_where=sa.text(DUE), sqlite_where=sa.text(DUE))
    op.create_table(
        "provider_batch_lines",
        sa.Column("job_id", sa.String(64), primary_key=True),
        sa.Column("line_no", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("deployment", sa.String(255), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("provider_batch_id", sa.String(64), nullable=True),
        sa.Column("bytes", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.Integer(), nullable=False),
        sa.Column("queued_at", STAMP, nullable=False),
    )
    op.create_index("ix_provider_batch_lines_provider_batch_id", "provider_batch_lines",
                    ["provider_batch_id"])
    op.create_index("ix_provider_batch_lines_queued", "provider_batch_lines",
                    ["deployment", "queued_at"],
                    postgresql_where=sa.text(QUEUED), sqlite_where=sa.text(QUEUED))


def downgrade() -> None:
    op.drop_table("provider_batch_lines")
    op.drop_table("provider_batches")

"""Tenants, API keys, uploaded files, and the OpenAI Batch view of jobs.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "tenants",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("max_enqueued_tokens", sa.BigInteger),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(64), sa.ForeignKey("tenants.name", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("revoked_at", TS),
    )
    op.create_table(
        "files",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("filename", sa.String(255), nullable=False),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_files_tenant_created", "files", ["tenant", "created_at"])
    op.create_table(
        "file_chunks",
        sa.Column("file_id", sa.String(64), sa.ForeignKey("files.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )
    # Jobs from before tenants belong to "default", the auth-off and embedded tenant.
    op.add_column("jobs", sa.Column("tenant", sa.String(64), nullable=False,
                                    server_default="default"))
    op.add_column("jobs", sa.Column("input_file_id", sa.String(64)))
    op.add_column("jobs", sa.Column("enqueued_tokens", sa.BigInteger))
    op.add_column("jobs", sa.Column("errors", JSON))
    op.create_index("ix_jobs_tenant_created", "jobs", ["tenant", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_jobs_tenant_created", "jobs")
    for column in ("errors", "enqueued_tokens", "input_file_id", "tenant"):
        op.drop_column("jobs", column)
    op.drop_table("file_chunks")
    op.drop_index("ix_files_tenant_created", "files")
    op.drop_table("files")
    op.drop_table("api_keys")
    op.drop_table("tenants")

"""Idempotency keys for job creation, and items cheap enough to COPY a million of.

Jobs remember the Idempotency-Key they were created with, unique per tenant.

On PostgreSQL, every item row used to cost more in checks and index upkeep than in
storing it; ingest writes a million rows in one COPY (quotaflow/ingest/pipeline.py), so:
- items.job_id no longer has a foreign key to jobs: its per-row check (a locking
  lookup of the job for every item) was the largest cost of all. Items are only ever
  written by the transaction that inserts their job, and jobs are never deleted, so
  nothing can be orphaned. SQLite keeps its foreign key (cheap there, and dropping
  it would rebuild the table).
- ix_items_job_duplicate_of holds only the rows that have a duplicate_of (the copies
  waiting for an identical request's answer), not one NULL entry per item.
- ix_items_body_hash is a hash index: the digest is only ever looked up by equality.

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
    op.drop_index("ix_items_job_duplicate_of", "items")
    op.create_index("ix_items_job_duplicate_of", "items", ["job_id", "duplicate_of"],
                    postgresql_where=sa.text("duplicate_of IS NOT NULL"),
                    sqlite_where=sa.text("duplicate_of IS NOT NULL"))
    if op.get_bind().dialect.name == "postgresql":
        op.drop_constraint("items_job_id_fkey", "items", type_="foreignkey")
        op.drop_index("ix_items_body_hash", "items")
        op.create_index("ix_items_body_hash", "items", ["body_hash"], postgresql_using="hash")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_index("ix_items_body_hash", "items")
        op.create_index("ix_items_body_hash", "items", ["body_hash"])
        op.create_foreign_key("items_job_id_fkey", "items", "jobs", ["job_id"], ["id"],
                              ondelete="CASCADE")
    op.drop_index("ix_items_job_duplicate_of", "items")
    op.create_index("ix_items_job_duplicate_of", "items", ["job_id", "duplicate_of"])
    op.drop_index("uq_jobs_tenant_idempotency_key", "jobs")
    op.drop_column("jobs", "idempotency_key")

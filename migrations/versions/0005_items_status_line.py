"""Items by job, status and line: writes for one chunk stay one chunk's work.

A new job's id is not in the table's statistics until autovacuum analyses it, so
the planner guesses "one row" for it. With an index on (job_id, status) alone, it
then preferred that index for the statement that closes a chunk's items
(job_id = X AND status IN (open) AND line_no IN (...)), and read every open item of
the job for every chunk: at 100,000 requests, 46 ms per chunk and most of
PostgreSQL's CPU. With line_no in the index, either index it picks finds the chunk's
rows directly, so the cost per request no longer grows with the job.

ix_items_open_lease answers the reaper (pending or running items whose lease or
queue patience ran out) from the open items alone; it scanned every item ever
stored, every reap_interval_s.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_items_job_status_line", "items", ["job_id", "status", "line_no"])
    op.drop_index("ix_items_job_status", "items")
    open_items = sa.text("status IN ('pending', 'running')")
    op.create_index("ix_items_open_lease", "items", ["status", "lease_expires_at"],
                    postgresql_where=open_items, sqlite_where=open_items)


def downgrade() -> None:
    op.drop_index("ix_items_open_lease", "items")
    op.create_index("ix_items_job_status", "items", ["job_id", "status"])
    op.drop_index("ix_items_job_status_line", "items")

"""Items updated in place: a request's claim and close no longer rewrite its indexes.

Every request updates its item twice (claimed: pending -> running with a lease; closed:
running -> succeeded or failed). PostgreSQL can make such an update HOT (heap-only: the
new version on the same page, no index touched) only when no indexed column changes
value and the page has room. `status` was in ix_items_job_status_line and in
ix_items_open_lease (its columns and its predicate), `lease_expires_at` in the latter, so
both updates inserted a new entry into all five of the items' indexes (the primary key,
the unique custom_id, the body hash, the two status indexes): most of PostgreSQL's CPU
per request (issue 29).

Now:
- items.is_open, a stored generated column (status IN pending, running, waiting), is the
  only indexed trace of the status: ix_items_job_open (job_id, line_no) WHERE is_open
  holds the open items, which is what the status index was asked for (a job's last open
  line, the reaper's candidates, a job's pending lines). A claim leaves is_open true, so
  it is HOT; the close changes it once.
- the two status indexes go; nothing else indexes status or lease_expires_at.
- fillfactor 50: room on each page for the claimed version of its rows, so the claim
  finds space beside the row; the close reuses what the claim's pruned version frees.
- results.job_id loses its foreign key, as items' did in 0004: its per-row check (a
  locking lookup of the job for every result stored) cost about as much as the rest of
  the insert. Results are written only for items of a job in progress, and jobs are
  deleted only while `validating` (before any result), so nothing can be orphaned.
  SQLite keeps it (cheap there; dropping it would rebuild the table).

The generated column is STORED on PostgreSQL (the rewrite of existing rows happens
once, here) and VIRTUAL on SQLite (the only kind ALTER TABLE can add there).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-25
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

IS_OPEN = "status IN ('pending', 'running', 'waiting')"
OPEN_LEASE = "status IN ('pending', 'running')"


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    op.add_column("items", sa.Column("is_open", sa.Boolean(),
                                     sa.Computed(IS_OPEN, persisted=postgres)))
    op.create_index("ix_items_job_open", "items", ["job_id", "line_no"],
                    postgresql_where=sa.text("is_open"), sqlite_where=sa.text("is_open"))
    op.drop_index("ix_items_job_status_line", "items")
    op.drop_index("ix_items_open_lease", "items")
    if postgres:
        op.execute("ALTER TABLE items SET (fillfactor = 50)")
        op.drop_constraint("results_job_id_fkey", "results", type_="foreignkey")


def downgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    if postgres:
        op.create_foreign_key("results_job_id_fkey", "results", "jobs", ["job_id"], ["id"],
                              ondelete="CASCADE")
        op.execute("ALTER TABLE items RESET (fillfactor)")
    op.create_index("ix_items_open_lease", "items", ["status", "lease_expires_at"],
                    postgresql_where=sa.text(OPEN_LEASE), sqlite_where=sa.text(OPEN_LEASE))
    op.create_index("ix_items_job_status_line", "items", ["job_id", "status", "line_no"])
    op.drop_index("ix_items_job_open", "items")
    op.drop_column("items", "is_open")

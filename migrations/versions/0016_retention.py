"""Retention: a job's output expiry and its tombstone, an upload's expiry.

jobs.output_expires_after_s is how long a job's output is kept after the job ends (the
submitter's `output_expires_after`, else QUOTAFLOW_RESULT_RETENTION_S when the job was
made; NULL keeps it). jobs.deleted_at marks a job whose results were deleted (on request
or on expiry): from then on they are gone for every reader, and the sweep removes the rows
a bounded transaction at a time until it sets purged_at. tombstone keeps what the job
object still reports (request counts, usage, why). files.expires_at: when an upload goes.
Existing jobs and files get NULL: nothing stored before this migration expires.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-26
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
STAMP = sa.DateTime(timezone=True)
RETAINED = "deleted_at IS NULL AND output_expires_after_s IS NOT NULL"
UNPURGED = "deleted_at IS NOT NULL AND purged_at IS NULL"
EXPIRING = "expires_at IS NOT NULL"


def upgrade() -> None:
    op.add_column("jobs", sa.Column("output_expires_after_s", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("deleted_at", STAMP, nullable=True))
    op.add_column("jobs", sa.Column("purged_at", STAMP, nullable=True))
    op.add_column("jobs", sa.Column("tombstone", JSON, nullable=True))
    op.create_index("ix_jobs_retained", "jobs", ["status"],
                    postgresql_where=sa.text(RETAINED), sqlite_where=sa.text(RETAINED))
    op.create_index("ix_jobs_unpurged", "jobs", ["deleted_at"],
                    postgresql_where=sa.text(UNPURGED), sqlite_where=sa.text(UNPURGED))
    op.add_column("files", sa.Column("expires_at", STAMP, nullable=True))
    op.create_index("ix_files_expires_at", "files", ["expires_at"],
                    postgresql_where=sa.text(EXPIRING), sqlite_where=sa.text(EXPIRING))


def downgrade() -> None:
    op.drop_index("ix_files_expires_at", table_name="files")
    with op.batch_alter_table("files") as batch:
        batch.drop_column("expires_at")
    op.drop_index("ix_jobs_unpurged", table_name="jobs")
    op.drop_index("ix_jobs_retained", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        for column in ("tombstone", "purged_at", "deleted_at", "output_expires_after_s"):
            batch.drop_column(column)

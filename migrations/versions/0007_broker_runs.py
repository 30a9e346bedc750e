"""The broker's last run id, in PostgreSQL (quotaflow/dispatch/broker_watch.py).

Kept in Redis before, a restart was noticed only by a worker that had already seen
the old id: a broker restarted empty within a reaper interval of the workers'
start went unnoticed, and its lost messages waited for the queue patience.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "broker_runs",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("broker_runs")

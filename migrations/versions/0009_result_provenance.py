"""Each result says where and how it was got: the deployment of its last call, the
calls made, when that call was admitted, sent and answered, and the provider's request id.

All nullable: results stored before, and lines never sent, have none. No index: a job's
report reads its results through the primary key (job_id, line_no), and the chunked
insert on the hot path stays as cheap as it was.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("deployment", "attempts", "admitted_at", "sent_at", "answered_at",
           "provider_request_id")


def upgrade() -> None:
    op.add_column("results", sa.Column("deployment", sa.String(255), nullable=True))
    op.add_column("results", sa.Column("attempts", sa.Integer(), nullable=True))
    for name in ("admitted_at", "sent_at", "answered_at"):
        op.add_column("results", sa.Column(name, sa.DateTime(timezone=True), nullable=True))
    op.add_column("results", sa.Column("provider_request_id", sa.String(255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("results") as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)

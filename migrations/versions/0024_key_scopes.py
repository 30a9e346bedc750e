"""Keys that say what they may do (scope, expiry, rotation, last use, allowlists), and
the audit log of what was done with them.

api_keys.scope is "read", "submit" or "admin"; existing keys get "admin", so every key
made before keeps doing what it did. expires_at ends a key (its own expiry, or a
rotation's grace period, with replaced_by naming its successor); last_used_at is
written at most once a minute per key. allowed_models and allowed_deployments, on a key
and on its tenant, are JSON lists of names (NULL: any). audit_events holds one row per
create, cancel, retry or delete of a job, file, batch, key or webhook endpoint.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
STAMP = sa.DateTime(timezone=True)
LISTS = ("allowed_models", "allowed_deployments")


def upgrade() -> None:
    op.add_column("api_keys", sa.Column("scope", sa.String(16), nullable=False,
                                        server_default="admin"))
    op.add_column("api_keys", sa.Column("expires_at", STAMP, nullable=True))
    op.add_column("api_keys", sa.Column("replaced_by", sa.String(64), nullable=True))
    op.add_column("api_keys", sa.Column("last_used_at", STAMP, nullable=True))
    for table in ("api_keys", "tenants"):
        for column in LISTS:
            op.add_column(table, sa.Column(column, JSON, nullable=True))
    op.create_table(
        "audit_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True,
                  autoincrement=True),
        sa.Column("at", STAMP, nullable=False),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("key_id", sa.String(64), nullable=True),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("object_type", sa.String(32), nullable=False),
        sa.Column("object_id", sa.String(128), nullable=False),
        sa.Column("client", sa.String(64), nullable=True))
    op.create_index("ix_audit_events_tenant_id", "audit_events", ["tenant", "id"])
    op.create_index("ix_audit_events_at", "audit_events", ["at"])


def downgrade() -> None:
    op.drop_table("audit_events")
    # Plain DROP COLUMN: PostgreSQL, and SQLite since 3.35 (no index names these columns).
    for column in LISTS:
        op.drop_column("tenants", column)
    for column in (*LISTS, "last_used_at", "replaced_by", "expires_at", "scope"):
        op.drop_column("api_keys", column)

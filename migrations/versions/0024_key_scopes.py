"""Keys that say what they may do: scope, expiry, rotation, last use, allowlists.

api_keys.scope is "read", "submit" or "admin"; existing keys get "admin", so every key
made before keeps doing what it did. expires_at ends a key (its own expiry, or a
rotation's grace period, with replaced_by naming its successor); last_used_at is
written at most once a minute per key. allowed_models and allowed_deployments, on a key
and on its tenant, are JSON lists of names (NULL: any).

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


def downgrade() -> None:
    # Plain DROP COLUMN: PostgreSQL, and SQLite since 3.35 (no index names these columns).
    for column in LISTS:
        op.drop_column("tenants", column)
    for column in (*LISTS, "last_used_at", "replaced_by", "expires_at", "scope"):
        op.drop_column("api_keys", column)

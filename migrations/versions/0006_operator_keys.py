"""API keys with the operator scope.

`GET /limits` shows every deployment's live usage, that is, what every tenant is
doing; it now needs a key made with `quotaflow keys create --operator`. Existing
keys are tenants' keys (false): an operator makes a new key for themselves.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("api_keys", sa.Column("operator", sa.Boolean, nullable=False,
                                        server_default=sa.false()))


def downgrade() -> None:
    op.drop_column("api_keys", "operator")

"""results.response as text on PostgreSQL: the server no longer parses every answer it stores.

A result's answer is the provider's own text, already parsed by the worker (its usage
read, its form checked: a JSON object, no NaN), or quotaflow's own output of an object;
the chunk statement (quotaflow/results/chunk_write.py) sends it inside the chunk's JSON
document. As a json column, each answer was parsed once more on its way in; as text it
is taken as the document holds it, byte for byte. On this project's 2-core VM,
json_to_recordset of 10,000 rows of ~700 bytes cost the server 20-22 us a row with the
answer as text against 24-26 as json (issue 29; docs/benchmarks.md, tenth pass).
Everything reads it as text already (downloads `response::text`) or through the
model's type (models.JsonText), which makes it an object again.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-28
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":  # SQLite's JSON is text already
        op.execute("ALTER TABLE results ALTER COLUMN response TYPE text USING response::text")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE results ALTER COLUMN response TYPE json USING response::json")

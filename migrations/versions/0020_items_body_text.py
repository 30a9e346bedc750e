"""items.body as text on PostgreSQL: the server no longer parses every request it stores.

Ingest writes each body once, in its COPY, as the compact text it made with orjson from
the object it had just parsed and checked (canonical_body), so the text is JSON by
construction; nothing else writes a body but the same kind of code. The json column
(migration 0019) still parsed each one on the way in to check it: a 200,000-row insert
of 150-byte bodies on this project's 2-core VM took 0.62 s as json and 0.21 s as text,
and ingest of 200,000 lines through the pipeline, nine rounds alternated, cost the server
14.7 us a line at the median against 16.7 (issue 29; docs/benchmarks.md, ninth pass).
It is read back only as text (the claim's `body::text`, downloads, offload) and turned
into an object by the model's type (models.JsonText). A query that wants a field
of it casts it: `body::json ->> 'model'`.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-27
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":  # SQLite's JSON is text already
        op.execute("ALTER TABLE items ALTER COLUMN body TYPE text USING body::text")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE items ALTER COLUMN body TYPE json USING body::json")

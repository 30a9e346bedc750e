"""items.body as json, not jsonb: a request is stored as ingest wrote it.

A request's body is written once, by ingest's COPY, as the compact text ingest made of
it (canonical_body: sorted keys, no spaces), and read back only as text: the claim
returns `body::text` for the worker to parse, downloads and offload read it whole.
jsonb parsed every body into its binary tree on the COPY and printed it back (with
spaces) on every claim; json checks the text and keeps it. Measured on this project's
2-core machine (COPY of 200,000 rows of about 400 bytes into a copy of the items table
with its indexes, three runs each, alternated): 16.3-18.1 -> 13.4-14.3 us a row
(issue 29). The one expression on a body, `body ->> 'model'` (the route of an item
ingested before routes were stored), reads json as well.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-27
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":  # SQLite's JSON is text already
        op.execute("ALTER TABLE items ALTER COLUMN body TYPE json USING body::json")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE items ALTER COLUMN body TYPE jsonb USING body::jsonb")

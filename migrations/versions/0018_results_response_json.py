"""results.response as json, not jsonb: the answer's text is stored as it is written.

Every answer is written once and read back as text: into a download line
(results/output_pieces.py, `response::text`) or parsed by Python. jsonb parsed each
answer into its binary tree on the chunk write and printed it back out on every
download; json only checks the text and hands it back unchanged. Measured on this
project's 2-core machine (20,000 rows of a 600-byte chat.completion, chunks of 100
through json_to_recordset, then string_agg pieces of 2,000 lines as the download
makes them): the insert 18-28 -> 14 us a row, the download 5.5-6.1 -> 2.6-2.9 us a
line (issue 29).

What changes for users: an output line's `response.body` keeps the provider's own key
order (jsonb sorted keys by length). Answers that came with line breaks (a
pretty-printed body) are stored compact, as before (results/leases.py), so every
output line stays one line. `error` and `shared_from`, rare and small, stay jsonb.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-26
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":  # SQLite's JSON is text already
        op.execute("ALTER TABLE results ALTER COLUMN response TYPE json USING response::json")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE results ALTER COLUMN response TYPE jsonb "
                   "USING response::jsonb")

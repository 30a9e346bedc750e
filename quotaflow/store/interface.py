"""The storage seam: the operations whose SQL differs between the two databases.

quotaflow keeps its jobs in PostgreSQL for the cluster and in SQLite for the embedded
`quotaflow run`. The statements that differ (prepared PostgreSQL text on the hot path,
portable SQLAlchemy elsewhere) sit behind this one interface, in the same order in
both implementations (postgres.py, sqlite.py): the rest of the domain asks `store.of`
and never looks at the dialect.
"""

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import Insert, Table
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.store.items import ClaimedItem, LineRange


class Store(Protocol):
    """One database's way of running items, storing results and reading them back."""

    # Whether job_tallies is kept by triggers (jobs/tallies.py), and the analyses that
    # need PostgreSQL's aggregates run (observe/report_data.py, observe/bound_data.py).
    keeps_tallies: bool
    aggregates: bool
    # Whether ingest writes its items with COPY (ingest/bulkwrite.py), or with INSERTs.
    copies: bool

    def claim(self, sessions: sessionmaker[Session], ref: LineRange, owner: str,
              lease: timedelta) -> list[ClaimedItem]:
        """Lease the range's pending items (and those whose lease ran out) to `owner`,
        in line order, while the job is in progress; attempts counted."""

    def report(self, session: Session, ref: LineRange) -> datetime | None:
        """After a batch: close the job if nothing is open (close_job), and the latest
        lease still running in the range (None: none is held)."""

    def store_chunk(self, session: Session, job_id: str, rows: Sequence[dict[str, Any]],
                    now: datetime) -> list[tuple[int, str]]:
        """Insert the rows (results.rows.result_row) not stored yet and close their
        items, in the session's transaction: (line_no, status) of each item closed."""

    def piece_starts(self, session: Session, job_id: str) -> range | None:
        """The first line of each piece of the success file the database writes itself
        (render_piece), or None where Python writes the lines."""

    def render_piece(self, session: Session, job_id: str, first: int) -> bytes | None:
        """The success lines from line `first` on, made by the database; None if none."""

    def close_job(self, session: Session, job_id: str) -> None:
        """End the job once no item is open (in progress: completed, cancelling:
        cancelled), in the caller's transaction; safe from every worker at once."""

    def lock_tenant(self, session: Session, key: int) -> None:
        """Hold the tenant's lock until the transaction ends (tenants/quotas.py)."""

    def insert_ignore(self, table: Table) -> Insert:
        """INSERT ... ON CONFLICT DO NOTHING: a row that may be there already."""

    def insert_adding(self, table: Table, keys: Sequence[str], added: Sequence[str],
                      keep_null: Sequence[str] = (), keep: Sequence[str] = ()) -> Insert:
        """INSERT ... ON CONFLICT (keys) DO UPDATE adding `added` (upserts.adding)."""

    def refresh_statistics(self, sessions: sessionmaker[Session], table: Table) -> None:
        """Let the planner see a table that just grew by a large job; best effort."""

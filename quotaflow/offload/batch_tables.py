"""The provider batches and the lines they hold, in PostgreSQL: what survives a restart.

A line is `queued` (recorded by a batch run, in no provider batch yet), `assigned` (in
one), `realtime` (fell back: the executor sends it to the route's realtime deployments
and never batches it again) or `done` (its result is stored). A provider batch is
`uploading` (its lines are chosen, the intent stored before any upload), `submitted`
(the provider's id is known: it is polled), `collecting` (it ended at the provider: its
results are being stored) or `done`.
"""

from datetime import datetime

from sqlalchemy import BigInteger, Index, Integer, String, Text, text
from sqlalchemy.orm import Mapped, mapped_column

from quotaflow.models import Base, utcnow


class LineState:
    QUEUED = "queued"
    ASSIGNED = "assigned"
    REALTIME = "realtime"
    DONE = "done"


class BatchState:
    UPLOADING = "uploading"
    SUBMITTED = "submitted"
    COLLECTING = "collecting"
    DONE = "done"
    OPEN = (UPLOADING, SUBMITTED, COLLECTING)


class ProviderBatch(Base):
    """One batch at a provider: one job's lines on one batch deployment."""

    __tablename__ = "provider_batches"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # ours: qfpb_...
    job_id: Mapped[str] = mapped_column(String(64), index=True)
    deployment: Mapped[str] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(String(16))
    lines: Mapped[int] = mapped_column(Integer)
    bytes: Mapped[int] = mapped_column(BigInteger)
    # The provider's ids: its batch, the uploaded input file, the output and error files.
    provider_id: Mapped[str | None] = mapped_column(String(255))
    input_file_id: Mapped[str | None] = mapped_column(String(255))
    provider_status: Mapped[str | None] = mapped_column(String(32))
    # Why quotaflow asked the provider to cancel it: "cancelled", "expired" (the job's)
    # or "window" (the job's window would be missed: its lines move to realtime).
    cancel_reason: Mapped[str | None] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    submitted_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]
    # When a worker should look at it next; a claim moves it a lease ahead.
    next_poll_at: Mapped[datetime] = mapped_column(default=utcnow)


DUE = "state IN ('uploading', 'submitted', 'collecting')"
Index("ix_provider_batches_due", ProviderBatch.next_poll_at,
      postgresql_where=text(DUE), sqlite_where=text(DUE))


class ProviderBatchLine(Base):
    """A line of a job on its way through a provider batch (custom_id there: q{line_no})."""

    __tablename__ = "provider_batch_lines"

    job_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    line_no: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    deployment: Mapped[str] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(String(16))
    provider_batch_id: Mapped[str | None] = mapped_column(String(64), index=True)
    bytes: Mapped[int] = mapped_column(Integer)
    tokens: Mapped[int] = mapped_column(Integer)
    queued_at: Mapped[datetime] = mapped_column(default=utcnow)


QUEUED = "state = 'queued'"
Index("ix_provider_batch_lines_queued", ProviderBatchLine.deployment,
      ProviderBatchLine.queued_at, postgresql_where=text(QUEUED), sqlite_where=text(QUEUED))

"""What runs beside a batch's calls: its leases renewed (lease_renewal.py), its feedback
settled and its answers stored as they come (flushing.py); and, once the calls end,
all of it stopped, the job's watch closed and the last feedback settled.
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from quotaflow.execution.batch import BatchRun
from quotaflow.execution.flushing import flush_when_due
from quotaflow.execution.lease_renewal import keep_leases


@contextlib.asynccontextmanager
async def beside(run: BatchRun, sessions: sessionmaker[Session],
                 lease: timedelta) -> AsyncIterator[None]:
    """Keep the run's leases and flush its feedback and answers while the block runs."""
    ref = run.ref
    keeper = asyncio.create_task(keep_leases(sessions, ref.job_id, run.owner, lease, run.fence,
                                             (ref.first_line, ref.last_line)))
    flusher = asyncio.create_task(flush_when_due(run))
    try:
        yield
    finally:
        keeper.cancel()
        await run.watch.close()
        flusher.cancel()  # a write under way goes on (shielded); the next one waits
        with contextlib.suppress(asyncio.CancelledError):
            await flusher
        run.feedback.flush()

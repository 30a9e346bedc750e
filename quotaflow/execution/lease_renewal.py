"""Lease renewal: a live batch's items must never look abandoned to the reaper.

A claim leases its items for `lease_s`; while the batch runs, the lease
is renewed at a third of its length, so only a worker that stopped running
(killed, frozen, cut off from the database) lets its items' leases run out.
"""

import asyncio
import logging
import time
from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from quotaflow.execution.fencing import Fence
from quotaflow.results.leases import renew

log = logging.getLogger(__name__)


async def keep_leases(sessions: sessionmaker[Session], job_id: str, owner: str,
                      lease: timedelta, fence: Fence | None = None,
                      lines: tuple[int, int] | None = None) -> None:
    """Renew `owner`'s leases on the job's items (within `lines`, first and last, where
    given) until cancelled, telling the fence. A renewal that fails (the database is
    restarting) is tried again at the next beat, not given up."""
    while True:
        await asyncio.sleep(lease.total_seconds() / 3)
        started = time.monotonic()
        try:
            await asyncio.to_thread(renew, sessions, job_id, owner, lease, lines)
            if fence is not None:
                fence.renewed(started)
        except Exception as exc:  # SQLAlchemy's errors for a database that is away
            log.warning("lease renewal for %s failed (%s); trying again at the next beat",
                        job_id, exc.__class__.__name__, extra={"job_id": job_id})

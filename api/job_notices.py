"""Job status changes pushed by PostgreSQL, so that a long-poll answers as a job ends.

Migration 0023 has PostgreSQL NOTIFY `quotaflow_jobs` with a job's id whenever its status
changes, whichever transaction changes it (a worker closing the job, a cancel, an
expiry), delivered when that transaction commits. One connection per API process
LISTENs, from its first watched job on: a notice drops the process's recent read of the
job and wakes the job's watch, which reads it at once rather than at its next interval.
Without notices (SQLite, or while the connection is remade after a fault) watches still
read every interval: notices make answers sooner, never different.
"""

import asyncio
import logging
from collections.abc import Callable

import psycopg
from sqlalchemy.engine import make_url

CHANNEL = "quotaflow_jobs"  # migrations/versions/0023_job_status_notices.py
RECONNECT_S = 1.0

log = logging.getLogger(__name__)


def listen_dsn(database_url: str) -> str | None:
    """The libpq address to listen on, or None for a database without notices."""
    url = make_url(database_url)
    if url.get_backend_name() != "postgresql":
        return None
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


async def listen(dsn: str, on_notice: Callable[[str], None]) -> None:
    """Call `on_notice(job_id)` for each status change, until cancelled; a lost
    connection is made again after RECONNECT_S."""
    while True:
        try:
            conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
            async with conn:
                await conn.execute(f"LISTEN {CHANNEL}")
                async for notice in conn.notifies():
                    on_notice(notice.payload)
        except (psycopg.Error, OSError) as exc:
            log.warning("job status notices paused (%s); long-polls read every interval "
                        "meanwhile", type(exc).__name__)
        await asyncio.sleep(RECONNECT_S)

"""A batch run hands its bulk lines to a provider batch deployment: they are recorded, not
called.

One transaction records the lines (`queued`, with their size and prompt tokens for the
provider's limits) and moves their items from the run's lease to no lease at all: the
poll loop (loop.py) owns them from then on, and neither the reaper nor another claim
can take them. A line that already fell back to realtime (tables.LineState.REALTIME)
is never queued again.
"""

from collections.abc import Sequence
from typing import Any, cast

import orjson
from sqlalchemy import CursorResult, delete, select, update
from sqlalchemy.orm import Session, sessionmaker

from quotaflow import store
from quotaflow.budget.tokens import prompt_tokens
from quotaflow.deployments.deployment import Deployment
from quotaflow.models import ItemStatus, utcnow
from quotaflow.offload import OWNER
from quotaflow.offload.batch_tables import LineState, ProviderBatchLine
from quotaflow.results.leases import ITEMS, ClaimedItem

LINES = ProviderBatchLine.__table__
# Bytes a line's envelope adds to its body in the provider's file (custom_id, url, ...).
ENVELOPE_BYTES = 120


def fell_back(sessions: sessionmaker[Session], job_id: str, lines: Sequence[int]) -> set[int]:
    """The lines that came back from a provider batch to be sent to realtime deployments."""
    with sessions() as session:
        return set(session.scalars(select(LINES.c.line_no).where(
            LINES.c.job_id == job_id, LINES.c.line_no.in_(list(lines)),
            LINES.c.state == LineState.REALTIME)))


def enqueue(sessions: sessionmaker[Session], job_id: str, owner: str, url: str,
            deployment: Deployment, items: Sequence[ClaimedItem]) -> int:
    """Queue the claimed items for `deployment`'s next provider batch; how many were."""
    if not items:
        return 0
    now = utcnow()
    rows = [dict(job_id=job_id, line_no=item.line_no, deployment=deployment.name,
                 state=LineState.QUEUED, provider_batch_id=None,
                 bytes=len(orjson.dumps(item.body)) + ENVELOPE_BYTES,
                 tokens=prompt_tokens(url, item.body), queued_at=now)
            for item in items]
    lines = [item.line_no for item in items]
    with sessions.begin() as session:
        # A line done before (its failure retried: jobs.retry_failed) is queued afresh.
        session.execute(delete(LINES).where(LINES.c.job_id == job_id, LINES.c.line_no.in_(lines),
                                            LINES.c.state == LineState.DONE))
        session.execute(store.of(session).insert_ignore(LINES), rows)
        return cast("CursorResult[Any]", session.execute(
            update(ITEMS)
            .where(ITEMS.c.job_id == job_id, ITEMS.c.line_no.in_(lines),
                   ITEMS.c.lease_owner == owner, ITEMS.c.status == ItemStatus.RUNNING)
            .values(lease_owner=OWNER, lease_expires_at=None))).rowcount

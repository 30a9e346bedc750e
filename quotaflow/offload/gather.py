"""Queued lines become provider batches: one job's lines on one deployment, within the
provider's limits (lines, bytes, estimated prompt tokens).

A job's queued lines are cut into batches as soon as they fill one, and the rest once
its oldest line has waited QUOTAFLOW_PROVIDER_BATCH_GATHER_S for more to join (a
bulk job's batch runs queue their lines a hundred at a time). The cut is the intent,
stored before anything is uploaded: the batch row (`uploading`) and which lines it
holds, in one transaction, the queued lines locked with SKIP LOCKED so that workers
gathering at once never put a line in two batches.
"""

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.deployments.catalog import Deployments
from quotaflow.deployments.deployment import Deployment
from quotaflow.models import utcnow
from quotaflow.offload.batch_tables import BatchState, LineState, ProviderBatch, ProviderBatchLine

LINES = ProviderBatchLine.__table__
BATCHES = ProviderBatch.__table__
# Queued lines one round looks at (the rest wait for the next round, which comes at once).
GATHER_LIMIT = 200_000


def gather(sessions: sessionmaker[Session], deployments: Deployments, wait_s: float) -> int:
    """Cut provider batches from the queued lines; how many batches were made."""
    now = utcnow()
    with sessions.begin() as session:
        rows = session.execute(
            select(LINES.c.job_id, LINES.c.line_no, LINES.c.deployment, LINES.c.bytes,
                   LINES.c.tokens, LINES.c.queued_at)
            .where(LINES.c.state == LineState.QUEUED)
            .order_by(LINES.c.deployment, LINES.c.job_id, LINES.c.line_no)
            .limit(GATHER_LIMIT).with_for_update(skip_locked=True)).all()
        groups: dict[tuple[str, str], list[Any]] = {}
        for row in rows:
            groups.setdefault((row.job_id, row.deployment), []).append(row)
        made = 0
        for (job_id, name), lines in groups.items():
            deployment = deployments.deployments.get(name)
            if deployment is None:
                continue  # the deployments file changed: its lines wait for it
            for cut in _cuts(lines, deployment, now - timedelta(seconds=wait_s)):
                _make(session, job_id, name, cut, now)
                made += 1
    return made


def _cuts(lines: Sequence[Any], deployment: Deployment, ripe: datetime) -> list[list[Any]]:
    """Full batches in line order, and the rest where its oldest line has waited enough."""
    max_lines, max_bytes, max_tokens = deployment.batch_limits
    cuts: list[list[Any]] = []
    current: list[Any] = []
    size = tokens = 0
    for line in lines:
        if current and (len(current) >= max_lines or size + line.bytes > max_bytes
                        or (max_tokens is not None and tokens + line.tokens > max_tokens)):
            cuts.append(current)
            current, size, tokens = [], 0, 0
        current.append(line)
        size += line.bytes
        tokens += line.tokens
    if current and (len(current) >= max_lines or min(line.queued_at
                                                     for line in current) <= ripe):
        cuts.append(current)
    return cuts


def _make(session: Session, job_id: str, deployment: str, lines: list[Any],
          now: datetime) -> None:
    batch_id = f"qfpb_{uuid.uuid4().hex}"
    session.execute(BATCHES.insert().values(
        id=batch_id, job_id=job_id, deployment=deployment, state=BatchState.UPLOADING,
        lines=len(lines), bytes=sum(line.bytes for line in lines), created_at=now,
        next_poll_at=now))
    session.execute(update(LINES)
                    .where(LINES.c.job_id == job_id,
                           LINES.c.line_no.in_([line.line_no for line in lines]))
                    .values(state=LineState.ASSIGNED, provider_batch_id=batch_id))

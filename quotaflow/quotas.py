"""Each tenant's quota of enqueued tokens, like OpenAI's enqueued-token limit.

A tenant's unfinished batches may hold at most so many prompt tokens (about
characters / 4, as providers count them at admission). A new batch is
estimated before anything of it is stored, and refused with the numbers when
it would not fit. On PostgreSQL the check and the creation hold a per-tenant
advisory lock, so two batches sent at once cannot both slip under the limit.
"""

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.config import Settings
from quotaflow.errors import EnqueuedTokenLimit
from quotaflow.formats import Request, parse_stream
from quotaflow.models import Job, JobStatus, Tenant
from quotaflow.tokens import estimate_tokens, prompt_text


@dataclass
class Estimate:
    """What a file would enqueue: its prompt tokens, and its valid lines per endpoint."""

    tokens: int = 0
    lines_by_url: dict[str, list[int]] = field(default_factory=dict)


def estimate(stream: IO[bytes], max_line_bytes: int) -> Estimate:
    """One pass over the file; invalid lines count nothing (they are never sent)."""
    result = Estimate()
    for entry in parse_stream(stream, max_line_bytes):
        if isinstance(entry, Request):
            result.tokens += estimate_tokens(prompt_text(entry.url, entry.body))
            result.lines_by_url.setdefault(entry.url, []).append(entry.line_no)
    return result


def enqueued_tokens(session: Session, tenant: str) -> int:
    """Prompt tokens of the tenant's batches that have not finished."""
    return int(session.scalar(
        select(func.coalesce(func.sum(Job.enqueued_tokens), 0))
        .where(Job.tenant == tenant, Job.status.in_(JobStatus.ACTIVE))) or 0)


def token_limit(session: Session, settings: Settings, tenant: str) -> int | None:
    own = session.scalar(select(Tenant.max_enqueued_tokens).where(Tenant.name == tenant))
    return own if own is not None else settings.max_enqueued_tokens


def check(session: Session, settings: Settings, tenant: str, tokens: int) -> None:
    limit = token_limit(session, settings, tenant)
    if limit is None:
        return
    held = enqueued_tokens(session, tenant)
    if held + tokens > limit:
        raise EnqueuedTokenLimit(
            f"enqueued token limit reached for tenant {tenant!r}: this batch has about "
            f"{tokens:,} prompt tokens, unfinished batches already hold {held:,}, and the "
            f"limit is {limit:,}. Wait for batches to finish, split the file, or raise the "
            "limit (QUOTAFLOW_MAX_ENQUEUED_TOKENS, or `quotaflow keys create --tenant "
            f"{tenant} --max-enqueued-tokens N`)")


@contextmanager
def reserve(sessions: sessionmaker[Session], settings: Settings, tenant: str,
            tokens: int) -> Iterator[None]:
    """Check the quota and keep other batches of the tenant out until the body is done."""
    with _tenant_lock(sessions, tenant):
        with sessions() as session:
            check(session, settings, tenant, tokens)
        yield


@contextmanager
def _tenant_lock(sessions: sessionmaker[Session], tenant: str) -> Iterator[None]:
    engine = sessions.kw["bind"]
    if engine.dialect.name != "postgresql":  # SQLite: one writer at a time anyway
        yield
        return
    key = int.from_bytes(hashlib.sha256(f"quotaflow-tenant:{tenant}".encode()).digest()[:8],
                         "big", signed=True)
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": key})
        conn.commit()
        try:
            yield
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": key})
            conn.commit()

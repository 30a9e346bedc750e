"""Each tenant's quota of enqueued tokens, like OpenAI's enqueued-token limit.

A tenant's unfinished batches may hold at most so many prompt tokens (about
characters / 4, as providers count them at admission). Ingest counts a file's
tokens in the same pass that stores it (quotaflow/ingest/pipeline.py) and calls `admit`
before it commits: on PostgreSQL that takes a per-tenant advisory lock held to
the end of the transaction, so two batches committing at once cannot both slip
under the limit, and a refused batch rolls back with nothing of it stored.
"""

import hashlib
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from quotaflow import store
from quotaflow.config import Settings
from quotaflow.errors import EnqueuedTokenLimit
from quotaflow.models import Job, JobStatus, Tenant


@dataclass(frozen=True)
class Headroom:
    """What a tenant may still enqueue, read without the lock when ingest starts: a file
    that already exceeds it is refused early; `admit` decides for good."""

    tenant: str
    held: int
    limit: int | None

    def refuse_if_over(self, tokens: int) -> None:
        if self.limit is not None and self.held + tokens > self.limit:
            raise _refusal(self.tenant, tokens, self.held, self.limit, partial=True)


def enqueued_tokens(session: Session, tenant: str) -> int:
    """Prompt tokens of the tenant's batches that have not finished."""
    return int(session.scalar(
        select(func.coalesce(func.sum(Job.enqueued_tokens), 0))
        .where(Job.tenant == tenant, Job.status.in_(JobStatus.ACTIVE))) or 0)


def token_limit(session: Session, settings: Settings, tenant: str) -> int | None:
    own = session.scalar(select(Tenant.max_enqueued_tokens).where(Tenant.name == tenant))
    return own if own is not None else settings.max_enqueued_tokens


def headroom(session: Session, settings: Settings, tenant: str) -> Headroom:
    limit = token_limit(session, settings, tenant)
    return Headroom(tenant, enqueued_tokens(session, tenant) if limit is not None else 0, limit)


def check(session: Session, settings: Settings, tenant: str, tokens: int) -> None:
    limit = token_limit(session, settings, tenant)
    if limit is None:
        return
    held = enqueued_tokens(session, tenant)
    if held + tokens > limit:
        raise _refusal(tenant, tokens, held, limit, partial=False)


def admit(session: Session, settings: Settings, tenant: str, tokens: int) -> None:
    """Check the quota inside the transaction that creates the batch, holding the tenant's
    lock until it commits or rolls back. The new job's own row must not count yet
    (its enqueued_tokens are set after this). A tenant without a limit takes no lock:
    its jobs are made side by side."""
    if token_limit(session, settings, tenant) is None:
        return
    lock_tenant(session, tenant)
    check(session, settings, tenant, tokens)


def lock_tenant(session: Session, tenant: str) -> None:
    """The tenant's transaction-scoped advisory lock (SQLite has one writer anyway)."""
    store.of(session).lock_tenant(session, tenant_lock_key(tenant))


def tenant_lock_key(tenant: str) -> int:
    return int.from_bytes(hashlib.sha256(f"quotaflow-tenant:{tenant}".encode()).digest()[:8],
                          "big", signed=True)


def _refusal(tenant: str, tokens: int, held: int, limit: int, partial: bool) -> EnqueuedTokenLimit:
    size = f"at least {tokens:,}" if partial else f"about {tokens:,}"
    return EnqueuedTokenLimit(
        f"enqueued token limit reached for tenant {tenant!r}: this batch has {size} prompt "
        f"tokens, unfinished batches already hold {held:,}, and the limit is {limit:,}. Wait "
        "for batches to finish, split the file, or raise the limit "
        "(QUOTAFLOW_MAX_ENQUEUED_TOKENS, or `quotaflow keys create --tenant "
        f"{tenant} --max-enqueued-tokens N`)")

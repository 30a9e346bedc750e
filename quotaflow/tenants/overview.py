"""What the console shows of tenants: their keys (never a secret: the id and the key's
public prefix only), scopes, expiry and allowlists, and their caps and usage against them.

Usage is read from the limiter's own cap buckets, one peek per deployment budget (no
write), so it is exactly what admission sees: requests and tokens left of each cap's
bucket, per deployment budget the tenant's caps apply to.
"""

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from quotaflow.budget.limiter import Limiter
from quotaflow.deployments.deployment import Deployment
from quotaflow.deployments.limits import Cap
from quotaflow.errors import ServiceUnavailable
from quotaflow.models import ApiKey, Tenant
from quotaflow.tenants.keys import KEY_PREFIX


@dataclass(frozen=True)
class KeyView:
    id: str
    masked: str  # the prefix every key shares, then dots: no part of the secret
    scope: str
    operator: bool
    state: str  # "active", "revoked", "expired"
    expires_at: datetime | None
    last_used_at: datetime | None
    models: list[str] | None
    deployments: list[str] | None


@dataclass(frozen=True)
class CapUse:
    """One deployment budget under a tenant's cap: what is left of it now."""

    budget: str
    requests_left: float | None  # None: requests not capped
    request_capacity: float
    tokens_left: float | None  # None: tokens not capped
    token_capacity: float


@dataclass(frozen=True)
class TenantView:
    name: str
    weight: float
    max_rpm: int | None
    max_tpm: int | None
    models: list[str] | None
    deployments: list[str] | None
    keys: list[KeyView]
    usage: list[CapUse]


def tenants(session: Session, only: str | None, now: datetime) -> list[TenantView]:
    """Every tenant (an operator's view), or `only` that one, with its keys; usage empty
    (`with_usage` fills it)."""
    query = select(Tenant).order_by(Tenant.name)
    if only is not None:
        query = query.where(Tenant.name == only)
    rows = list(session.scalars(query))
    keys: dict[str, list[KeyView]] = {row.name: [] for row in rows}
    key_query = select(ApiKey).order_by(ApiKey.created_at)
    if only is not None:
        key_query = key_query.where(ApiKey.tenant == only)
    for key in session.scalars(key_query):
        if key.tenant in keys:
            keys[key.tenant].append(_key_view(key, now))
    return [TenantView(row.name, row.weight, row.max_rpm, row.max_tpm, row.allowed_models,
                       row.allowed_deployments, keys[row.name], []) for row in rows]


def _key_view(key: ApiKey, now: datetime) -> KeyView:
    state = "active"
    if key.revoked_at is not None:
        state = "revoked"
    elif key.expires_at is not None and key.expires_at <= now:
        state = "expired"
    return KeyView(key.id, KEY_PREFIX + "…", key.scope, key.operator, state, key.expires_at,
                   key.last_used_at, key.allowed_models, key.allowed_deployments)


def with_usage(view: TenantView, deployments: list[Deployment],
               limiter: Limiter) -> TenantView:
    """The tenant with what is left of its caps on each deployment budget (none where it
    has no cap, or the limiter cannot be read)."""
    if not (view.max_rpm or view.max_tpm):
        return view
    cap = Cap(f"tenant:{view.name}", float(view.max_rpm or 0), float(view.max_tpm or 0))
    usage, seen = [], set()
    for deployment in deployments:
        budget = deployment.budget
        if budget.name in seen:
            continue
        seen.add(budget.name)
        try:
            levels = limiter.levels(budget.with_caps((cap,)))
        except ServiceUnavailable:
            return view
        requests, tokens = levels.caps[0]
        request_capacity, token_capacity = cap.capacities(budget.burst_seconds)
        usage.append(CapUse(budget.name, requests if view.max_rpm else None, request_capacity,
                            tokens if view.max_tpm else None, token_capacity))
    return TenantView(view.name, view.weight, view.max_rpm, view.max_tpm, view.models,
                      view.deployments, view.keys, usage)

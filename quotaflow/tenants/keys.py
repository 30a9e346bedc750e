"""API keys and the tenants they act for.

A key is shown once, when it is created, and stored only as its SHA-256
digest: a database dump gives no usable key. Keys are long random strings,
so a plain (unsalted) digest is as safe as a password hash here and lets the
API find a key with one indexed lookup per request. A key acts for one tenant;
an operator key (`--operator`) may also read what spans every tenant, such as
every deployment's live usage.
"""

import hashlib
import re
import secrets
import uuid
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import CursorResult, select, update
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.errors import AuthenticationError, InvalidParameter, NotFound, PermissionDenied
from quotaflow.models import ApiKey, Tenant, utcnow

KEY_PREFIX = "qf-"
_TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class NewKey:
    """A freshly created key: `secret` exists only here, never in the database."""

    id: str
    tenant: str
    secret: str
    operator: bool = False


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def check_tenant_name(name: str) -> str:
    if not _TENANT_NAME.match(name):
        raise InvalidParameter("tenant", f"tenant name {name!r} is not allowed: use 1-64 "
                               "letters, digits, '.', '_' or '-', starting with a letter or digit")
    return name


def create_key(sessions: sessionmaker[Session], tenant: str,
               max_enqueued_tokens: int | None = None, operator: bool = False,
               max_monthly_spend: float | None = None,
               weight: float | None = None) -> NewKey:
    """A new key for `tenant` (created if new); sets the tenant's token quota, monthly
    spend limit and fair-share weight when given.
    An operator key also reaches the routes that show every tenant's activity."""
    check_tenant_name(tenant)
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    key_id = f"key_{uuid.uuid4().hex[:16]}"
    with sessions.begin() as session:
        row = session.get(Tenant, tenant)
        if row is None:
            row = Tenant(name=tenant, created_at=utcnow())
            session.add(row)
        if max_enqueued_tokens is not None:
            row.max_enqueued_tokens = max_enqueued_tokens
        if max_monthly_spend is not None:
            row.max_monthly_spend = max_monthly_spend
        if weight is not None:
            row.weight = weight
        session.flush()
        session.add(ApiKey(id=key_id, tenant=tenant, key_hash=hash_key(secret),
                           created_at=utcnow(), operator=operator))
    return NewKey(key_id, tenant, secret, operator)


def revoke_key(sessions: sessionmaker[Session], key_id: str) -> None:
    with sessions.begin() as session:
        done = cast("CursorResult[Any]", session.execute(
            update(ApiKey).where(ApiKey.id == key_id, ApiKey.revoked_at.is_(None))
            .values(revoked_at=utcnow())))
        if done.rowcount == 0:
            raise NotFound(f"no active key with id {key_id!r}; "
                           "`quotaflow keys list` shows them")


def list_keys(session: Session) -> list[ApiKey]:
    return list(session.scalars(select(ApiKey).order_by(ApiKey.tenant, ApiKey.created_at)))


def tenant_for_key(session: Session, secret: str | None) -> str:
    """The tenant a presented key acts for; AuthenticationError for none or an unknown one."""
    return key_grant(session, secret)[0]


def operator_for_key(session: Session, secret: str | None) -> str:
    """The tenant of a presented operator key; PermissionDenied for a tenant's key."""
    return operator_tenant(*key_grant(session, secret))


def operator_tenant(tenant: str, operator: bool) -> str:
    """The tenant of an operator's key; PermissionDenied for a tenant's key."""
    if not operator:
        raise PermissionDenied(
            "this route shows every tenant's activity and needs an operator key; "
            "`quotaflow keys create --tenant NAME --operator` makes one")
    return tenant


def key_grant(session: Session, secret: str | None) -> tuple[str, bool]:
    """The tenant a presented key acts for and whether it is an operator's;
    AuthenticationError for none, an unknown or a revoked key."""
    if not secret:
        raise AuthenticationError(
            "no API key given: send `Authorization: Bearer <key>` (or `x-api-key: <key>`); "
            "`quotaflow keys create --tenant NAME` makes one")
    row = session.execute(select(ApiKey.tenant, ApiKey.operator)
                          .where(ApiKey.key_hash == hash_key(secret),
                                 ApiKey.revoked_at.is_(None))).first()
    if row is None:
        raise AuthenticationError("incorrect API key provided; "
                                  "`quotaflow keys create --tenant NAME` makes a new one")
    return row.tenant, row.operator

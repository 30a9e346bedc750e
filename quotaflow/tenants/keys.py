"""API keys and the tenants they act for.

A key is shown once, when it is created (or rotated), and stored only as its SHA-256
digest: a database dump gives no usable key. Keys are long random strings,
so a plain (unsalted) digest is as safe as a password hash here and lets the
API find a key with one indexed lookup per request. A key acts for one tenant, within
its scope, its expiry and its allowlists (quotaflow/tenants/grants.py); an operator key
(`--operator`) may also read what spans every tenant, such as every deployment's live
usage. Rotation makes a new key with the old one's tenant, scope and allowlists and
lets the old one work until a grace period ends, so clients can move without a gap.
"""

import hashlib
import re
import secrets
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.budget.caps import check_cap
from quotaflow.errors import AuthenticationError, InvalidParameter, NotFound, PermissionDenied
from quotaflow.models import ApiKey, Tenant, utcnow
from quotaflow.tenants import audit
from quotaflow.tenants.grants import Allowlist, Grant, Scope, expired

KEY_PREFIX = "qf-"
_TENANT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# How long a rotated key keeps working unless the rotation says otherwise.
DEFAULT_GRACE = timedelta(hours=1)
# A key's last_used_at is written when it is older than this (key_cache.py asks no sooner).
TOUCH_EVERY = timedelta(seconds=60)


@dataclass(frozen=True)
class NewKey:
    """A freshly created key: `secret` exists only here, never in the database."""

    id: str
    tenant: str
    secret: str
    operator: bool = False
    scope: str = "admin"
    expires_at: datetime | None = None


@dataclass(frozen=True)
class KeyRules:
    """What a new key may do: its scope, its lifetime and its own allowlists (None: any)."""

    scope: Scope = Scope.ADMIN
    expires_in: timedelta | None = None
    models: Sequence[str] | None = None
    deployments: Sequence[str] | None = None


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
               weight: float | None = None, rules: KeyRules = KeyRules(),
               actor: audit.Actor | None = None, max_rpm: int | None = None,
               max_tpm: int | None = None) -> NewKey:
    """A new key for `tenant` (created if new); sets the tenant's token quota, monthly
    spend limit, fair-share weight and RPM/TPM caps (quotaflow/budget/caps.py) when given.
    An operator key also reaches the routes that show every tenant's activity."""
    check_tenant_name(tenant)
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
        if max_rpm is not None:
            row.max_rpm = check_cap("rpm", max_rpm)
        if max_tpm is not None:
            row.max_tpm = check_cap("tpm", max_tpm)
        session.flush()
        made = _add_key(session, tenant, operator, rules)
        audit.record(session, actor, "create", "key", made.id, tenant)
        return made


def _add_key(session: Session, tenant: str, operator: bool, rules: KeyRules) -> NewKey:
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    key_id = f"key_{uuid.uuid4().hex[:16]}"
    now = utcnow()
    expires_at = now + rules.expires_in if rules.expires_in is not None else None
    session.add(ApiKey(id=key_id, tenant=tenant, key_hash=hash_key(secret), created_at=now,
                       operator=operator, scope=rules.scope.label, expires_at=expires_at,
                       allowed_models=_stored(rules.models),
                       allowed_deployments=_stored(rules.deployments)))
    return NewKey(key_id, tenant, secret, operator, rules.scope.label, expires_at)


def _stored(names: Sequence[str] | None) -> list[str] | None:
    return None if names is None else sorted(set(names))


def rotate_key(sessions: sessionmaker[Session], key_id: str,
               grace: timedelta = DEFAULT_GRACE,
               expires_in: timedelta | None = None,
               actor: audit.Actor | None = None) -> NewKey:
    """A new key in place of `key_id`: the same tenant, operator flag, scope and
    allowlists; the old key works until `grace` has passed (or its own expiry, if sooner).
    The new key lives `expires_in`, else as long as the old one was made to, else for ever."""
    with sessions.begin() as session:
        old = session.scalar(select(ApiKey).where(ApiKey.id == key_id,
                                                  ApiKey.revoked_at.is_(None))
                             .with_for_update())
        if old is None:
            raise NotFound(f"no active key with id {key_id!r}; "
                           "`quotaflow keys list` shows them")
        if old.replaced_by is not None:
            raise InvalidParameter("key_id", f"key {key_id} was already rotated, to "
                                             f"{old.replaced_by}: rotate that one")
        if expires_in is None and old.expires_at is not None:
            expires_in = old.expires_at - old.created_at
        made = _add_key(session, old.tenant, old.operator, KeyRules(
            Scope.named(old.scope), expires_in, old.allowed_models, old.allowed_deployments))
        grace_end = utcnow() + grace
        old.expires_at = (min(old.expires_at, grace_end) if old.expires_at
                          else grace_end)
        old.replaced_by = made.id
        audit.record(session, actor, "rotate", "key", key_id, old.tenant)
    return made


def _tenant(session: Session, tenant: str) -> Tenant:
    row = session.get(Tenant, check_tenant_name(tenant))
    if row is None:
        raise NotFound(f"no tenant {tenant!r}; `quotaflow keys create --tenant {tenant}` "
                       "makes it")
    return row


def set_tenant_allowlist(sessions: sessionmaker[Session], tenant: str,
                         models: Sequence[str] | None, deployments: Sequence[str] | None,
                         clear: bool = False, actor: audit.Actor | None = None) -> None:
    """Limit every key of `tenant` to these models and deployments (None leaves a list as
    it is; `clear` removes both lists)."""
    with sessions.begin() as session:
        row = _tenant(session, tenant)
        if clear:
            row.allowed_models = row.allowed_deployments = None
        if models is not None:
            row.allowed_models = _stored(models)
        if deployments is not None:
            row.allowed_deployments = _stored(deployments)
        audit.record(session, actor, "limit", "tenant", tenant, tenant)


def set_tenant_caps(sessions: sessionmaker[Session], tenant: str, rpm: int | None,
                    tpm: int | None, clear: bool = False,
                    actor: audit.Actor | None = None) -> None:
    """Cap every job of `tenant` inside each deployment's budget (None leaves a cap as it
    is; `clear` removes both first). Workers read it with a job's facts: new jobs get it."""
    with sessions.begin() as session:
        row = _tenant(session, tenant)
        if clear:
            row.max_rpm = row.max_tpm = None
        if rpm is not None:
            row.max_rpm = check_cap("rpm", rpm)
        if tpm is not None:
            row.max_tpm = check_cap("tpm", tpm)
        audit.record(session, actor, "limit", "tenant", tenant, tenant)


def revoke_key(sessions: sessionmaker[Session], key_id: str,
               actor: audit.Actor | None = None) -> None:
    with sessions.begin() as session:
        tenant = session.scalar(update(ApiKey).where(ApiKey.id == key_id,
                                                     ApiKey.revoked_at.is_(None))
                                .values(revoked_at=utcnow()).returning(ApiKey.tenant))
        if tenant is None:
            raise NotFound(f"no active key with id {key_id!r}; "
                           "`quotaflow keys list` shows them")
        audit.record(session, actor, "revoke", "key", key_id, tenant)


def list_keys(session: Session) -> list[ApiKey]:
    return list(session.scalars(select(ApiKey).order_by(ApiKey.tenant, ApiKey.created_at)))


def touch(sessions: sessionmaker[Session], key_id: str, now: datetime) -> None:
    """Record that the key was used. The condition makes the write once a minute at most,
    however many API processes ask; the others match no row."""
    with sessions.begin() as session:
        session.execute(update(ApiKey).where(
            ApiKey.id == key_id,
            or_(ApiKey.last_used_at.is_(None), ApiKey.last_used_at < now - TOUCH_EVERY))
            .values(last_used_at=now))


def tenant_for_key(session: Session, secret: str | None) -> str:
    """The tenant a presented key acts for; AuthenticationError for none or an unknown one."""
    return key_grant(session, secret).tenant


def operator_for_key(session: Session, secret: str | None) -> str:
    """The tenant of a presented operator key; PermissionDenied for a tenant's key."""
    grant = key_grant(session, secret)
    return operator_tenant(grant.tenant, grant.operator)


def operator_tenant(tenant: str, operator: bool) -> str:
    """The tenant of an operator's key; PermissionDenied for a tenant's key."""
    if not operator:
        raise PermissionDenied(
            "this route shows every tenant's activity and needs an operator key; "
            "`quotaflow keys create --tenant NAME --operator` makes one")
    return tenant


def key_grant(session: Session, secret: str | None) -> Grant:
    """What a presented key may do (quotaflow/tenants/grants.py); AuthenticationError for
    none, an unknown or a revoked key, KeyExpired for one past its expiry."""
    if not secret:
        raise AuthenticationError(
            "no API key given: send `Authorization: Bearer <key>` (or `x-api-key: <key>`); "
            "`quotaflow keys create --tenant NAME` makes one")
    row = session.execute(
        select(ApiKey.id, ApiKey.tenant, ApiKey.operator, ApiKey.scope, ApiKey.expires_at,
               ApiKey.replaced_by, ApiKey.allowed_models, ApiKey.allowed_deployments,
               Tenant.allowed_models.label("tenant_models"),
               Tenant.allowed_deployments.label("tenant_deployments"))
        .outerjoin(Tenant, Tenant.name == ApiKey.tenant)
        .where(ApiKey.key_hash == hash_key(secret), ApiKey.revoked_at.is_(None))).first()
    if row is None:
        raise AuthenticationError("incorrect API key provided; "
                                  "`quotaflow keys create --tenant NAME` makes a new one")
    expires_at = row.expires_at.timestamp() if row.expires_at is not None else None
    grant = Grant(row.id, row.tenant, row.operator, Scope.named(row.scope), expires_at,
                  Allowlist.of((row.allowed_models, row.allowed_deployments),
                               (row.tenant_models, row.tenant_deployments)),
                  row.replaced_by)
    if expires_at is not None and utcnow().timestamp() >= expires_at:
        raise expired(row.id, expires_at, row.replaced_by)
    return grant

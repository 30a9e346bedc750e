"""FastAPI dependencies, as Annotated aliases the routes name in their signatures."""

import asyncio
import logging
from collections.abc import AsyncIterator
from functools import lru_cache
from typing import Annotated

from fastapi import Depends, Header, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker

from api import scopes
from api.job_reads import JobReads
from api.key_lookups import KeyLookups
from quotaflow.budget.limiter import Limiter
from quotaflow.config import Settings
from quotaflow.config import get_settings as get_settings  # job_status reads it here
from quotaflow.constants import DEFAULT_TENANT
from quotaflow.deployments.catalog import Deployments
from quotaflow.dispatch.queues import Dispatcher
from quotaflow.errors import QuotaflowError
from quotaflow.jobs import view as job_view
from quotaflow.models import utcnow
from quotaflow.runtime import Runtime
from quotaflow.tenants import audit, keys
from quotaflow.tenants.grants import Grant, Scope
from quotaflow.tenants.key_cache import KeyCache
from quotaflow.tenants.keys import operator_tenant
from workers.dispatch import CeleryDispatcher

log = logging.getLogger("quotaflow.api")
# What every request acts as with QUOTAFLOW_AUTH=off (development): the default tenant,
# with every scope.
OPEN_GRANT = Grant("none", DEFAULT_TENANT, True, Scope.ADMIN)
# last_used_at writes in flight (kept so that the event loop does not drop them).
_touches: set[asyncio.Future[None]] = set()


@lru_cache
def runtime() -> Runtime:
    """The API process's parts (quotaflow/runtime.py); jobs are queued through Celery."""
    return Runtime(get_settings(), CeleryDispatcher)


async def sessions_dep() -> sessionmaker[Session]:
    return sessions()


def sessions() -> sessionmaker[Session]:
    return runtime().sessions


async def deployments_dep() -> Deployments:
    return deployments()


def deployments() -> Deployments:
    return runtime().deployments


async def limiter_dep() -> Limiter:
    return limiter()


def limiter() -> Limiter:
    return runtime().limiter


async def dispatcher_dep() -> Dispatcher:
    return dispatcher()


def dispatcher() -> Dispatcher:
    return runtime().dispatcher


async def session() -> AsyncIterator[Session]:
    """A session for the route, closed on a thread of its own when the answer is sent.

    An async dependency, so that neither its start nor its end waits for a thread of the
    pool the routes run on (api/admission.py says why that stalled the API)."""
    db_session = sessions()()
    try:
        yield db_session
    finally:
        await run_in_threadpool(db_session.close)


@lru_cache
def job_reads() -> JobReads:
    """This process's recent job objects (api/job_reads.py)."""
    return JobReads(get_settings().api_status_cache_s, lambda: sessions()(),
                    prefetch=job_view.prefetch)


async def settings_dep() -> Settings:
    return get_settings()


@lru_cache
def key_cache() -> KeyCache:
    return KeyCache(get_settings().api_key_cache_s)


def key_lookups() -> KeyLookups:
    """This process's key lookups in flight, over its key cache (api/key_lookups.py):
    made anew with the cache, so that a cache made for other settings takes its own."""
    return _lookups_over(key_cache())


@lru_cache
def _lookups_over(cache: KeyCache) -> KeyLookups:
    return KeyLookups(cache)


bearer = HTTPBearer(auto_error=False, scheme_name="ApiKey",
                    description="An API key made by `quotaflow keys create --tenant NAME`.")


# Anthropic's header for the same key: code written for Anthropic's API (its SDK, curl
# examples) sends the key there; either header is accepted on every route.
x_api_key = APIKeyHeader(name="x-api-key", auto_error=False, scheme_name="XApiKey",
                         description="The same API key, in the header Anthropic's API uses.")


async def presented_key(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
        header_key: Annotated[str | None, Depends(x_api_key)]) -> str | None:
    """The key the request carries: `Authorization: Bearer` first, else `x-api-key`."""
    return credentials.credentials if credentials else header_key


async def _grant(key: str | None) -> Grant:
    """The key's grant: remembered by the process, else looked up on a thread (one
    lookup per key at a time); its last_used_at written (off the request's path) when a
    minute has passed."""
    found = await key_lookups().grant(sessions(), key)
    _touch_when_due(found)
    return found


def remembered_grant(key: str | None) -> Grant | None:
    """What the request's key may do if this process remembers it (OPEN_GRANT with
    QUOTAFLOW_AUTH=off), with its last use recorded as `_grant` does; None where the
    `grant` dependency must decide (a key not remembered, or expired: its 401)."""
    if not get_settings().auth:
        return OPEN_GRANT
    try:
        found = key_lookups().remembered(sessions(), key)
    except QuotaflowError:
        return None
    if found is not None:
        _touch_when_due(found)
    return found


def _touch_when_due(found: Grant) -> None:
    if key_cache().touch_due(found.key_id):
        touch = asyncio.ensure_future(run_in_threadpool(_touch, found.key_id))
        _touches.add(touch)
        touch.add_done_callback(_touches.discard)


def _touch(key_id: str) -> None:
    try:
        keys.touch(sessions(), key_id, utcnow())
    except Exception as exc:  # the request was served; the next minute writes it
        log.warning("could not record key %s's last use: %r", key_id, exc)


async def grant(request: Request, key: Annotated[str | None, Depends(presented_key)]) -> Grant:
    """What the request's key may do, checked against what the route needs
    (api/scopes.py): 401 without a valid key, 403 for a scope too low; with
    QUOTAFLOW_AUTH=off, everything, as the tenant "default"."""
    if not get_settings().auth:
        return OPEN_GRANT
    found = await _grant(key)
    path = request.url.path
    found.require(scopes.needed(request.method, path), f"{request.method} {path}")
    return found


async def actor(request: Request, found: Annotated[Grant, Depends(grant)]) -> audit.Actor:
    """Who acts, for the audit log: the key, its tenant and the client's address."""
    return audit.Actor(found.tenant, None if found is OPEN_GRANT else found.key_id,
                       request.client.host if request.client else None)


async def tenant(found: Annotated[Grant, Depends(grant)]) -> str:
    """The tenant the request acts for: its API key's, or "default" when QUOTAFLOW_AUTH=off."""
    return found.tenant


async def operator(found: Annotated[Grant, Depends(grant)]) -> str:
    """The tenant of an operator key: routes showing every tenant's activity need one
    (401 without a key, 403 for a tenant's key); anyone when QUOTAFLOW_AUTH=off."""
    return operator_tenant(found.tenant, found.operator)


# Ids quotaflow hands out (batch_..., file-..., key_...): anything else cannot name an
# object, and is refused before it reaches the database (a NUL there is a server error).
ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"
IdPath = Annotated[str, Path(pattern=ID_PATTERN)]
# A client's name for one creation request (printable ASCII): sent again with a retried
# upload, it gets the job the first one made instead of a second job.
IdempotencyKey = Annotated[str | None, Header(
    alias="Idempotency-Key", pattern=r"^[\x21-\x7e]{1,255}$",
    description="Retry-safe creation: the same key gives the job made with it before")]
# A text field or parameter holding JSON (a job's `metadata`), as JSON Schema states it.
JSON_OBJECT_OF_STRINGS = {"contentMediaType": "application/json", "contentSchema": {
    "type": "object", "additionalProperties": {"type": "string", "pattern": r"^[^\x00]*$"}}}
AfterQuery = Annotated[str | None, Query(pattern=ID_PATTERN,
                                         description="Id of the last object of the previous page")]

# The dependencies are coroutines: FastAPI runs a plain function's on a thread of the pool
# the routes share, a hop per dependency per request.
SettingsDep = Annotated[Settings, Depends(settings_dep)]
SessionsDep = Annotated[sessionmaker[Session], Depends(sessions_dep)]
SessionDep = Annotated[Session, Depends(session)]
DeploymentsDep = Annotated[Deployments, Depends(deployments_dep)]
DispatcherDep = Annotated[Dispatcher, Depends(dispatcher_dep)]
LimiterDep = Annotated[Limiter, Depends(limiter_dep)]
TenantDep = Annotated[str, Depends(tenant)]
# The whole grant, for routes that need its allowlist (those that create jobs).
GrantDep = Annotated[Grant, Depends(grant)]
# Who acts, for the routes that change something (quotaflow/tenants/audit.py).
ActorDep = Annotated[audit.Actor, Depends(actor)]

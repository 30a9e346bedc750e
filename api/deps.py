"""FastAPI dependencies, as Annotated aliases the routes name in their signatures."""

from functools import lru_cache
from typing import Annotated

from fastapi import Depends, Header, Path, Query
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker

from api.dispatch import CeleryDispatcher
from quotaflow.auth import operator_for_key, tenant_for_key
from quotaflow.config import Deployments, Settings, get_settings
from quotaflow.constants import DEFAULT_TENANT
from quotaflow.db import session_factory
from quotaflow.errors import ConfigError
from quotaflow.jobs import Dispatcher
from quotaflow.limiters import make_limiter
from quotaflow.placement import PlacingDispatcher
from quotaflow.ratelimit import Limiter


def sessions() -> sessionmaker[Session]:
    return session_factory(get_settings().database_url)


@lru_cache
def deployments() -> Deployments:
    return get_settings().load_deployments()


@lru_cache
def limiter() -> Limiter:
    return make_limiter(get_settings().limiter_url)


@lru_cache
def dispatcher() -> Dispatcher:
    broker = get_settings().broker_url
    if not broker:
        raise ConfigError("QUOTAFLOW_BROKER_URL is not set; the API queues jobs on Redis")
    # Batches for a local deployment go to its own queues (quotaflow/placement.py).
    return PlacingDispatcher(CeleryDispatcher(broker), sessions(), deployments())


def session() -> Session:
    with sessions()() as db_session:
        yield db_session


bearer = HTTPBearer(auto_error=False, scheme_name="ApiKey",
                    description="An API key made by `quotaflow keys create --tenant NAME`.")


def tenant(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> str:
    """The tenant the request acts for: its API key's, or "default" when QUOTAFLOW_AUTH=off."""
    if not get_settings().auth:
        return DEFAULT_TENANT
    with sessions()() as db_session:
        return tenant_for_key(db_session, credentials.credentials if credentials else None)


def operator(credentials: Annotated[HTTPAuthorizationCredentials | None,
                                    Depends(bearer)]) -> str:
    """The tenant of an operator key: routes showing every tenant's activity need one
    (401 without a key, 403 for a tenant's key); anyone when QUOTAFLOW_AUTH=off."""
    if not get_settings().auth:
        return DEFAULT_TENANT
    with sessions()() as db_session:
        return operator_for_key(db_session, credentials.credentials if credentials else None)


# Ids quotaflow hands out (batch_..., file-..., key_...): anything else cannot name an
# object, and is refused before it reaches the database (a NUL there is a server error).
ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"
IdPath = Annotated[str, Path(pattern=ID_PATTERN)]
# A client's name for one creation request (printable ASCII): sent again with a retried
# upload, it gets the job the first one made instead of a second job.
IdempotencyKey = Annotated[str | None, Header(
    alias="Idempotency-Key", pattern=r"^[\x21-\x7e]{1,255}$",
    description="Retry-safe creation: the same key gives the job made with it before")]
AfterQuery = Annotated[str | None, Query(pattern=ID_PATTERN,
                                         description="Id of the last object of the previous page")]

SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionsDep = Annotated[sessionmaker[Session], Depends(sessions)]
SessionDep = Annotated[Session, Depends(session)]
DeploymentsDep = Annotated[Deployments, Depends(deployments)]
DispatcherDep = Annotated[Dispatcher, Depends(dispatcher)]
LimiterDep = Annotated[Limiter, Depends(limiter)]
TenantDep = Annotated[str, Depends(tenant)]

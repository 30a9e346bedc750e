"""FastAPI dependencies, as Annotated aliases the routes name in their signatures."""

from functools import lru_cache
from typing import Annotated

from fastapi import Depends, Header, Path, Query
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.budget.limiter import Limiter
from quotaflow.config import Settings, get_settings
from quotaflow.constants import DEFAULT_TENANT
from quotaflow.deployments.catalog import Deployments
from quotaflow.dispatch.queues import Dispatcher
from quotaflow.runtime import Runtime
from quotaflow.tenants.keys import operator_for_key, tenant_for_key
from workers.dispatch import CeleryDispatcher


@lru_cache
def runtime() -> Runtime:
    """The API process's parts (quotaflow/runtime.py); jobs are queued through Celery."""
    return Runtime(get_settings(), CeleryDispatcher)


def sessions() -> sessionmaker[Session]:
    return runtime().sessions


def deployments() -> Deployments:
    return runtime().deployments


def limiter() -> Limiter:
    return runtime().limiter


def dispatcher() -> Dispatcher:
    return runtime().dispatcher


def session() -> Session:
    with sessions()() as db_session:
        yield db_session


bearer = HTTPBearer(auto_error=False, scheme_name="ApiKey",
                    description="An API key made by `quotaflow keys create --tenant NAME`.")


# Anthropic's header for the same key: code written for Anthropic's API (its SDK, curl
# examples) sends the key there; either header is accepted on every route.
x_api_key = APIKeyHeader(name="x-api-key", auto_error=False, scheme_name="XApiKey",
                         description="The same API key, in the header Anthropic's API uses.")


def presented_key(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
                  header_key: Annotated[str | None, Depends(x_api_key)]) -> str | None:
    """The key the request carries: `Authorization: Bearer` first, else `x-api-key`."""
    return credentials.credentials if credentials else header_key


def tenant(key: Annotated[str | None, Depends(presented_key)]) -> str:
    """The tenant the request acts for: its API key's, or "default" when QUOTAFLOW_AUTH=off."""
    if not get_settings().auth:
        return DEFAULT_TENANT
    with sessions()() as db_session:
        return tenant_for_key(db_session, key)


def operator(key: Annotated[str | None, Depends(presented_key)]) -> str:
    """The tenant of an operator key: routes showing every tenant's activity need one
    (401 without a key, 403 for a tenant's key); anyone when QUOTAFLOW_AUTH=off."""
    if not get_settings().auth:
        return DEFAULT_TENANT
    with sessions()() as db_session:
        return operator_for_key(db_session, key)


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

"""FastAPI dependencies, as Annotated aliases the routes name in their signatures."""

from functools import lru_cache
from typing import Annotated

from fastapi import Depends
from sqlalchemy.orm import Session, sessionmaker

from api.dispatch import CeleryDispatcher
from quotaflow.config import Deployments, Settings, get_settings
from quotaflow.db import session_factory
from quotaflow.errors import ConfigError
from quotaflow.jobs import Dispatcher
from quotaflow.placement import PlacingDispatcher
from quotaflow.ratelimit import Limiter, make_limiter


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


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionsDep = Annotated[sessionmaker[Session], Depends(sessions)]
SessionDep = Annotated[Session, Depends(session)]
DeploymentsDep = Annotated[Deployments, Depends(deployments)]
DispatcherDep = Annotated[Dispatcher, Depends(dispatcher)]
LimiterDep = Annotated[Limiter, Depends(limiter)]

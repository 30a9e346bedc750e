"""The API in this process, on the settings a test gives, through FastAPI's TestClient."""

from collections.abc import Iterator

import psycopg
import pytest
import redis
from fastapi.testclient import TestClient

from api import deps
from api.app import create_app
from quotaflow.budget.buckets import make_limiter
from quotaflow.config import Settings, get_settings


def app_client(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    """The API in process on `settings` (a generator: one client, closed after), with two
    routes more that raise what a dropped PostgreSQL connection and an unreachable Redis
    raise in the drivers, to see the API's answer to each."""
    monkeypatch.setattr(deps, "get_settings", lambda: settings)
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    app.dependency_overrides[deps.deployments] = settings.load_deployments
    app.dependency_overrides[deps.limiter] = lambda: make_limiter(settings.limiter_url)

    @app.get("/v1/copy")
    @app.get("/copy")
    def copy() -> None:  # the driver's own error, as a COPY on the raw connection raises it
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    @app.get("/v1/queue")
    @app.get("/queue")
    def queue() -> None:
        raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")

    with TestClient(app, raise_server_exceptions=False) as client:
        yield client

"""The API served by uvicorn on a real port, in a thread of the test's process: real
HTTP and real disconnects (which FastAPI's TestClient cannot give a stream), with the
app's state (its watched jobs) in reach of the test."""

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp

from api import deps
from api.app import create_app
from quotaflow.budget.buckets import make_limiter
from quotaflow.config import Settings, get_settings
from tests.harness.procs import free_port


@contextmanager
def api_in_thread(settings: Settings, monkeypatch: pytest.MonkeyPatch,
                  wrap: Callable[[ASGIApp], ASGIApp] | None = None,
                  ) -> Iterator[tuple[FastAPI, str]]:
    """The app on `settings` and its base URL, served until the block ends; `wrap`, a
    middleware around it (an API of another version, say)."""
    monkeypatch.setattr(deps, "get_settings", lambda: settings)
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    app.dependency_overrides[deps.deployments] = settings.load_deployments
    app.dependency_overrides[deps.limiter] = lambda: make_limiter(settings.limiter_url)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(wrap(app) if wrap else app, host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, name="api", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the API did not start"
        time.sleep(0.02)
    try:
        yield app, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)

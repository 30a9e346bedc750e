"""Scopes and expiry on every route of the API (in this process, on the test database):
every route the app has is walked, so a route added later is covered or named here as
open. A `read` key is refused (403, naming its scope and the route's) on everything but
reads, a `submit` key on webhook management, an expired key (401, saying when) on every
route, each in its API family's error shape; the console refuses a read key's cancel;
last_used_at is written once a minute, not per request."""

import re
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from api import deps, rate_limit
from api.console.session import COOKIE, csrf_token
from quotaflow.config import Settings
from quotaflow.models import ApiKey
from quotaflow.tenants import keys as auth
from quotaflow.tenants.grants import Scope
from tests.harness.api_app import app_client

# Routes that take no key: probes, Prometheus, the API's own documents. The console (not in
# the API document) signs in with a cookie and is tested below.
OPEN = {"/healthz", "/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc",
        "/copy", "/queue", "/v1/copy", "/v1/queue"}  # the last four: app_client's own
READS = {"GET", "HEAD"}
ANTHROPIC = "/v1/messages/"


@pytest.fixture
def api(settings: Settings, pg_sessions, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    settings.api_rate_limit = None  # a walk over every route is not a runaway script
    settings.api_key_cache_s = 300  # expiry must hold for remembered keys too
    monkeypatch.setattr(rate_limit, "get_settings", lambda: settings)
    deps.key_cache.cache_clear()
    yield from app_client(settings, monkeypatch)
    deps.key_cache.cache_clear()


def key(sessions, scope: Scope, operator: bool = True, **rules) -> str:
    return auth.create_key(sessions, "scoped", operator=operator,
                           rules=auth.KeyRules(scope, **rules)).secret


def keyed_routes(client: TestClient) -> list[tuple[str, str]]:
    """(method, path) of every route of the API document, with ids filled in; each must
    answer 401 without a key unless it is named open."""
    found: list[tuple[str, str]] = []
    for template, operations in client.app.openapi()["paths"].items():
        path = re.sub(r"\{[^}]+\}", "x_1", template)
        for method in operations:
            method = method.upper()
            if template in OPEN:
                continue
            answer = client.request(method, path)
            assert answer.status_code == 401, (
                f"{method} {template} answers {answer.status_code} without a key: give it "
                "TenantDep (or name it in OPEN)")
            found.append((method, path))
    assert len(found) >= 35
    return found


def error_of(answer, status: int, path: str) -> str:
    """The answer's message, checked to be in the route's family's error shape."""
    assert answer.status_code == status, (path, answer.status_code, answer.text)
    body = answer.json()
    if path.startswith(ANTHROPIC):
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
        kinds = {401: "authentication_error", 403: "permission_error"}
        assert body["error"]["type"] == kinds[status]
        return body["error"]["message"]
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["code"] == {401: "expired_api_key", 403: "insufficient_scope"}[status]
    return body["error"]["message"]


def call(client: TestClient, method: str, path: str, secret: str):
    return client.request(method, path, headers={"Authorization": f"Bearer {secret}"},
                          params={"wait": "0"} if method == "GET" else None)


def test_a_read_key_reads_and_is_refused_everything_else(api: TestClient, pg_sessions) -> None:
    secret = key(pg_sessions, Scope.READ)
    refused = 0
    for method, path in keyed_routes(api):
        answer = call(api, method, path, secret)
        if method in READS and not path.startswith("/audit"):
            assert answer.status_code not in (401, 403), (method, path, answer.text)
            continue
        message = error_of(answer, 403, path)
        needs = "admin" if path.startswith(("/webhooks", "/audit")) else "submit"
        assert f"has scope 'read'; {method} {path} needs scope '{needs}'" in message, message
        refused += 1
    assert refused >= 14


def test_a_submit_key_is_refused_webhook_management_only(api: TestClient, pg_sessions) -> None:
    secret = key(pg_sessions, Scope.SUBMIT)
    for method, path in keyed_routes(api):
        answer = call(api, method, path, secret)
        admin_only = path.startswith("/audit") or (
            path.startswith("/webhooks") and method not in READS)
        if admin_only:
            assert "needs scope 'admin'" in error_of(answer, 403, path)
        else:
            assert answer.status_code not in (401, 403), (method, path, answer.text)


def test_an_admin_key_is_refused_nowhere(api: TestClient, pg_sessions) -> None:
    secret = key(pg_sessions, Scope.ADMIN)
    for method, path in keyed_routes(api):
        answer = call(api, method, path, secret)
        assert answer.status_code not in (401, 403), (method, path, answer.text)


def test_an_expired_key_is_refused_everywhere_saying_when(api: TestClient, pg_sessions) -> None:
    secret = key(pg_sessions, Scope.ADMIN, expires_in=timedelta(seconds=2))
    assert call(api, "GET", "/jobs", secret).status_code == 200  # now remembered
    time.sleep(2.1)
    for method, path in keyed_routes(api):
        message = error_of(call(api, method, path, secret), 401, path)
        assert re.search(r"API key key_\w+ expired at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC",
                         message), message
    # and a key first seen after its expiry, looked up in the database
    with pg_sessions() as session:
        key_id = session.scalar(select(ApiKey.id).where(ApiKey.key_hash == auth.hash_key(secret)))
    deps.key_cache.cache_clear()
    message = error_of(call(api, "GET", "/v1/batches", secret), 401, "/v1/batches")
    assert f"API key {key_id} expired at" in message


def test_the_console_lets_a_read_key_look_but_not_cancel(api: TestClient, pg_sessions) -> None:
    secret = key(pg_sessions, Scope.READ, operator=False)
    signed = api.post("/console/login", data={"api_key": secret}, follow_redirects=False)
    assert signed.status_code == 303
    api.cookies.set(COOKIE, secret, path="/console")
    assert api.get("/console/jobs").status_code == 200
    for action in ("cancel", "retry"):
        answer = api.post(f"/console/jobs/x_1/{action}", data={"csrf_token": csrf_token(secret)})
        assert answer.status_code == 403 and "needs scope" in answer.text, answer.text
    expired = key(pg_sessions, Scope.ADMIN, expires_in=timedelta(seconds=0))
    refused = api.post("/console/login", data={"api_key": expired}, follow_redirects=False)
    assert refused.status_code == 401 and "expired at" in refused.text


def test_last_use_is_written_once_a_minute_not_per_request(
        api: TestClient, pg_sessions, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = key(pg_sessions, Scope.READ)
    writes: list[str] = []
    real_touch = auth.touch
    monkeypatch.setattr(auth, "touch", lambda *args: (writes.append(args[1]), real_touch(*args)))
    for _ in range(30):
        assert call(api, "GET", "/jobs", secret).status_code == 200
    deadline = time.monotonic() + 5
    while not writes and time.monotonic() < deadline:
        time.sleep(0.05)
    with pg_sessions() as session:
        row = session.scalars(select(ApiKey).where(ApiKey.key_hash == auth.hash_key(secret))).one()
    assert writes == [row.id] and row.last_used_at is not None
    # another process, asking within the minute, changes nothing
    first = row.last_used_at
    auth.touch(pg_sessions, row.id, first + timedelta(seconds=30))
    with pg_sessions() as session:
        assert session.get(ApiKey, row.id).last_used_at == first

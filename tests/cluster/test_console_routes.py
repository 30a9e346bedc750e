"""The console's routes over HTTP (the API in this process, on the test database): sign-in
and its cookie, a tenant seeing only its own jobs, CSRF on cancel, the operators' budgets
page, downloads, filters and paging. The browser drives it in test_console.py."""

import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from starlette.middleware.base import BaseHTTPMiddleware

from api import deps
from api.app import create_app
from api.console import SECURITY_HEADERS
from api.console.session import COOKIE, csrf_token
from quotaflow.budget.buckets import make_limiter
from quotaflow.budget.limiter import describe
from quotaflow.config import get_settings
from quotaflow.tenants import keys as auth
from tests.cluster.test_provenance import mock_deployments, run_job  # noqa: F401  (a fixture)


@pytest.fixture
def console(pg_sessions, settings, mock_deployments,  # noqa: F811
            monkeypatch) -> Iterator[TestClient]:
    settings.deployments_file = mock_deployments
    settings.provider_max_attempts = 1
    settings.flower_url = "http://flower.example:5555"
    monkeypatch.setattr(deps, "get_settings", lambda: settings)
    app = create_app()
    app.dependency_overrides[get_settings] = lambda: settings
    app.dependency_overrides[deps.deployments] = settings.load_deployments
    app.dependency_overrides[deps.limiter] = lambda: make_limiter(settings.limiter_url)
    with TestClient(app, follow_redirects=False) as client:
        yield client


def sign_in(client: TestClient, key: str) -> None:
    client.cookies.clear()
    answer = client.post("/console/login", data={"api_key": key})
    assert answer.status_code == 303, answer.text
    assert answer.headers["location"] == "/console/jobs"
    cookie = answer.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/console" in cookie


def test_a_tenant_sees_its_own_jobs_only(console, pg_sessions, settings) -> None:
    mine = run_job(pg_sessions, settings, 12)
    settings_other = settings.model_copy()
    theirs = run_job(pg_sessions, settings_other, 5)
    from sqlalchemy import update

    from quotaflow.models import Job
    with pg_sessions.begin() as session:
        session.execute(update(Job).where(Job.id == theirs.id).values(tenant="someone-else"))
    key = auth.create_key(pg_sessions, "default").secret
    # Signed out: the pages send to the sign-in form; a wrong key is refused with a reason
    assert console.get("/console/jobs").headers["location"] == "/console/login"
    wrong = console.post("/console/login", data={"api_key": "sk-wrong"})
    assert wrong.status_code == 401 and "incorrect API key" in wrong.text
    sign_in(console, key)
    page = console.get("/console/jobs")
    assert page.status_code == 200
    assert mine.id in page.text and theirs.id not in page.text
    assert 'name="viewport"' in page.text and "<label for=\"status\">" in page.text
    assert console.get(f"/console/jobs/{mine.id}").status_code == 200
    for path in ("", "/live", "/bound", "/plots", "/download/output"):
        other = console.get(f"/console/jobs/{theirs.id}{path}")
        assert other.status_code == 404, path
        assert "Not found" in other.text
    cancel = console.post(f"/console/jobs/{theirs.id}/cancel",
                          data={"csrf_token": csrf_token(key)})
    assert cancel.status_code == 404
    # Filters and paging: the same cursor as GET /jobs
    assert mine.id not in console.get("/console/jobs?status=in_progress").text
    assert mine.id in console.get("/console/jobs?queue=bulk").text
    assert console.get("/console/jobs?status=nonsense").status_code == 422
    # Downloads: the job's lines as files
    got = console.get(f"/console/jobs/{mine.id}/download/output")
    assert got.status_code == 200 and "attachment" in got.headers["content-disposition"]
    assert got.text.count("\n") + console.get(
        f"/console/jobs/{mine.id}/download/errors").text.count("\n") == 12


def test_cancel_needs_the_pages_token_and_origin(console, pg_sessions, settings) -> None:
    job = run_job(pg_sessions, settings, 3)
    key = auth.create_key(pg_sessions, "default").secret
    sign_in(console, key)
    page = console.get(f"/console/jobs/{job.id}").text
    token = re.search(r'name="csrf_token" value="([0-9a-f]+)"', page).group(1)
    assert token == csrf_token(key)
    assert console.post(f"/console/jobs/{job.id}/cancel").status_code == 403
    assert console.post(f"/console/jobs/{job.id}/cancel",
                        data={"csrf_token": "0" * 64}).status_code == 403
    assert console.post(f"/console/jobs/{job.id}/cancel", data={"csrf_token": token},
                        headers={"origin": "https://evil.example"}).status_code == 403
    # The job has ended: cancelling it is a 409 page, with the token right
    ended = console.post(f"/console/jobs/{job.id}/cancel", data={"csrf_token": token})
    assert ended.status_code == 409 and "<h1>" in ended.text
    # Pages say what they may load and run: their own files only
    assert "script-src 'self'" in console.get("/console/jobs").headers[
        "content-security-policy"]


def test_budgets_page_is_for_operators_with_the_numbers_of_quotaflow_limits(
        console, pg_sessions, settings) -> None:
    tenant_key = auth.create_key(pg_sessions, "default").secret
    operator_key = auth.create_key(pg_sessions, "ops", operator=True).secret
    sign_in(console, tenant_key)
    assert console.get("/console/limits").status_code == 403
    sign_in(console, operator_key)
    page = console.get("/console/limits")
    assert page.status_code == 200
    row = describe(settings.load_deployments().deployments["mock-http"],
                   make_limiter(settings.limiter_url))
    assert f"{row['rpm']:,}" in page.text and f"{row['request_capacity']:,.0f}" in page.text
    assert 'href="http://flower.example:5555"' in page.text
    assert console.cookies.get(COOKIE) == operator_key


def test_console_answers_carry_the_security_headers_and_the_api_passes_untouched(
        console) -> None:
    """The console's pages, error pages and static files carry the headers; the API's
    answers do not, and no BaseHTTPMiddleware wraps the app (it would run every piece of
    an upload's body and of a results stream through tasks of its own)."""
    for path in ("/console/login", "/console/jobs", "/console/no-such-page"):
        answer = console.get(path)
        for name, value in (*SECURITY_HEADERS.items(), ("Cache-Control", "no-store")):
            assert answer.headers.get(name) == value, (path, name)
    api = console.get("/healthz")
    assert api.status_code == 200
    assert "content-security-policy" not in api.headers
    assert "x-request-id" in api.headers
    assert not [m for m in console.app.user_middleware if m.cls is BaseHTTPMiddleware]

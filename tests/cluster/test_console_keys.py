"""The console's keys page over HTTP (the API in this process, on the test database and
Redis): a tenant sees its own keys (masked), scopes, expiry, allowlists, caps and what is
left of them, and never another tenant's or any key's secret; an operator sees every
tenant."""

import time
from datetime import timedelta

from fastapi.testclient import TestClient

from quotaflow.budget.buckets import make_limiter
from quotaflow.deployments.limits import Cap
from quotaflow.tenants import keys as auth
from quotaflow.tenants.grants import Scope
from tests.cluster.test_console_routes import console, sign_in  # noqa: F401  (a fixture)
from tests.cluster.test_provenance import mock_deployments  # noqa: F401  (a fixture)


def test_a_tenant_sees_its_keys_caps_and_usage_and_an_operator_every_tenant(
        console: TestClient, pg_sessions, settings) -> None:  # noqa: F811
    rules = auth.KeyRules(Scope.SUBMIT, timedelta(days=3), models=["gpt-4o-mini"])
    mine = auth.create_key(pg_sessions, "capsco", rules=rules, max_rpm=60, max_tpm=6000)
    second = auth.create_key(pg_sessions, "capsco")
    theirs = auth.create_key(pg_sessions, "othercorp")
    operator = auth.create_key(pg_sessions, "ops", operator=True)
    # The tenant has spent 10 requests and 1,000 tokens of its cap on the deployment
    deployment = next(iter(settings.load_deployments().deployments.values()))
    budget = deployment.budget.with_caps((Cap("tenant:capsco", 60, 6000),))
    limiter = make_limiter(settings.limiter_url)
    spent_at = time.monotonic()
    assert limiter.acquire(budget, [100] * 10, 0.0).admitted == 10

    sign_in(console, mine.secret)
    page = console.get("/console/keys")
    since_s = time.monotonic() - spent_at
    assert page.status_code == 200
    html = page.text
    for key in (mine, second):
        assert f'data-key="{key.id}"' in html
    assert 'data-tenant="othercorp"' not in html and theirs.id not in html
    assert "qf-…" in html and "submit" in html and "gpt-4o-mini" in html
    assert (mine.expires_at.strftime("%Y-%m-%d") if mine.expires_at else "?") in html
    assert '<dd class="rpm-cap">60</dd>' in html and '<dd class="tpm-cap">6,000</dd>' in html
    row = html.split(f'data-budget="{budget.name}"')[1].split("</tr>")[0]
    requests_left = float(row.split('<td class="n">')[1].split(" / ")[0].replace(",", ""))
    # 60 less 10, refilling one a second; the page shows tenths (rounded half up)
    assert 50 <= requests_left <= 50 + since_s + 0.05
    for key in (mine, second, theirs, operator):
        assert key.secret not in html and key.secret[3:12] not in html

    sign_in(console, operator.secret)
    everyone = console.get("/console/keys").text
    for tenant in ("capsco", "othercorp", "ops"):
        assert f'data-tenant="{tenant}"' in everyone
    assert theirs.id in everyone and "Tenants" in everyone
    for key in (mine, second, theirs, operator):
        assert key.secret not in everyone

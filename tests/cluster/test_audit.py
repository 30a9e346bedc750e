"""The audit log on the API in this process: every create, cancel, retry and delete of
jobs, files, batches, Message Batches and webhook endpoints, and every key made, rotated
or revoked, is a row naming the key, tenant, action, object and client; an action that
was refused leaves none; GET /audit shows a tenant its own rows and an operator every
tenant's, as `quotaflow audit` prints it; old rows are pruned by the retention sweep."""

import ipaddress
import json
import subprocess
from collections.abc import Iterator
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr
from sqlalchemy import select, update

from api import deps, rate_limit
from quotaflow.compat import retention
from quotaflow.config import Settings
from quotaflow.models import AuditEvent, Item, ItemStatus, Job, JobStatus, utcnow
from quotaflow.tenants import audit
from quotaflow.tenants import keys as auth
from tests.harness.api_app import app_client
from tests.harness.api_thread import api_in_thread
from tests.harness.factories import chat_line, jsonl
from tests.harness.procs import quotaflow
from tests.harness.servers import ROOT, service_env

CHAT = "/v1/chat/completions"
CLI = audit.OPERATOR_CLI


@pytest.fixture
def api(settings: Settings, pg_sessions, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    settings.api_rate_limit = None
    settings.webhook_secret_key = SecretStr("k" * 32)
    settings.webhook_allowed_networks = (ipaddress.ip_network("127.0.0.0/8"),)
    monkeypatch.setattr(rate_limit, "get_settings", lambda: settings)
    with pg_sessions.begin() as session:
        session.execute(AuditEvent.__table__.delete())
    deps.key_cache.cache_clear()
    yield from app_client(settings, monkeypatch)


def rows(sessions) -> list[tuple[str, str | None, str, str, str, str | None]]:
    with sessions() as session:
        return [(r.tenant, r.key_id, r.action, r.object_type, r.object_id, r.client)
                for r in session.scalars(select(AuditEvent).order_by(AuditEvent.id))]


def test_every_action_is_a_row_naming_who_what_and_where(api: TestClient, pg_sessions) -> None:
    made = auth.create_key(pg_sessions, "team-audit", actor=CLI)
    bearer = {"Authorization": f"Bearer {made.secret}"}
    body = jsonl([chat_line("a"), chat_line("b")])
    job = api.post("/jobs", headers=bearer, files={"file": ("a.jsonl", body)}).json()["id"]
    assert api.post(f"/jobs/{job}/cancel", headers=bearer).status_code == 200
    assert api.delete(f"/jobs/{job}", headers=bearer).status_code == 200
    # a job with a failed line, to retry
    retried = api.post("/jobs", headers=bearer, files={"file": ("r.jsonl", body)}).json()["id"]
    with pg_sessions.begin() as session:
        session.execute(update(Item).where(Item.job_id == retried)
                        .values(status=ItemStatus.FAILED))
        session.execute(update(Job).where(Job.id == retried).values(status=JobStatus.COMPLETED))
    assert api.post(f"/jobs/{retried}/retry", headers=bearer).json()["retried"] == 2
    file_id = api.post("/v1/files", headers=bearer, data={"purpose": "batch"},
                       files={"file": ("b.jsonl", body)}).json()["id"]
    batch = api.post("/v1/batches", headers=bearer, json={
        "input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h"}).json()["id"]
    assert api.post(f"/v1/batches/{batch}/cancel", headers=bearer).status_code == 200
    assert api.delete(f"/v1/files/{file_id}", headers=bearer).status_code == 200
    message_batch = api.post("/v1/messages/batches", headers=bearer, json={"requests": [
        {"custom_id": "m", "params": {"model": "claude", "max_tokens": 8,
                                      "messages": [{"role": "user", "content": "hi"}]}}]})
    msg_id = message_batch.json()["id"]
    msg_job = "batch_" + msg_id.removeprefix("msgbatch_")
    assert api.post(f"/v1/messages/batches/{msg_id}/cancel", headers=bearer).status_code == 200
    assert api.delete(f"/v1/messages/batches/{msg_id}", headers=bearer).status_code == 200
    hook = api.post("/webhooks", headers=bearer, json={"url": "http://127.0.0.1:9/h"}).json()
    assert api.delete(f"/webhooks/{hook['id']}", headers=bearer).status_code == 200
    rotated = auth.rotate_key(pg_sessions, made.id, timedelta(seconds=60), actor=CLI)
    auth.revoke_key(pg_sessions, rotated.id, actor=CLI)
    who = ("team-audit", made.id)
    assert rows(pg_sessions) == [
        ("team-audit", None, "create", "key", made.id, "cli"),
        (*who, "create", "job", job, "testclient"),
        (*who, "cancel", "job", job, "testclient"),
        (*who, "delete", "job", job, "testclient"),
        (*who, "create", "job", retried, "testclient"),
        (*who, "retry", "job", retried, "testclient"),
        (*who, "create", "file", file_id, "testclient"),
        (*who, "create", "job", batch, "testclient"),
        (*who, "cancel", "job", batch, "testclient"),
        (*who, "delete", "file", file_id, "testclient"),
        (*who, "create", "job", msg_job, "testclient"),
        (*who, "cancel", "job", msg_job, "testclient"),
        (*who, "delete", "job", msg_job, "testclient"),
        (*who, "create", "webhook", hook["id"], "testclient"),
        (*who, "delete", "webhook", hook["id"], "testclient"),
        ("team-audit", None, "rotate", "key", made.id, "cli"),
        ("team-audit", None, "revoke", "key", rotated.id, "cli"),
    ]


def test_a_refused_action_leaves_no_row(api: TestClient, pg_sessions) -> None:
    secret = auth.create_key(pg_sessions, "team-refused").secret
    bearer = {"Authorization": f"Bearer {secret}"}
    job = api.post("/jobs", headers=bearer,
                   files={"file": ("a.jsonl", jsonl([chat_line("a")]))}).json()["id"]
    with pg_sessions.begin() as session:
        session.execute(update(Job).where(Job.id == job).values(status=JobStatus.COMPLETED))
    assert api.post(f"/jobs/{job}/cancel", headers=bearer).status_code == 409
    assert api.post("/jobs", headers=bearer, files={"file": ("e.jsonl", b"")}).status_code == 400
    assert api.delete("/v1/files/file-nothing", headers=bearer).status_code == 404
    assert [r[2:4] for r in rows(pg_sessions)] == [("create", "job")]


def test_a_tenant_reads_its_own_log_and_an_operator_everyones(api: TestClient,
                                                              pg_sessions) -> None:
    mine = auth.create_key(pg_sessions, "log-a").secret
    theirs = auth.create_key(pg_sessions, "log-b").secret
    operator = auth.create_key(pg_sessions, "log-ops", operator=True).secret
    for secret in (mine, theirs):
        api.post("/jobs", headers={"Authorization": f"Bearer {secret}"},
                 files={"file": ("a.jsonl", jsonl([chat_line("a")]))})

    def log(secret: str, **params: str):
        return api.get("/audit", headers={"Authorization": f"Bearer {secret}"}, params=params)

    own = log(mine).json()
    assert [e["tenant"] for e in own["data"]] == ["log-a"] and own["has_more"] is False
    assert own["data"][0]["action"] == "create" and own["data"][0]["object"] == "audit_event"
    assert log(mine, tenant="log-b").status_code == 403
    assert {e["tenant"] for e in log(operator).json()["data"]} == {"log-a", "log-b"}
    assert [e["tenant"] for e in log(operator, tenant="log-b").json()["data"]] == ["log-b"]
    page = log(operator, limit="1").json()
    assert page["has_more"] is True
    rest = log(operator, before=str(page["data"][0]["id"])).json()["data"]
    assert [e["id"] for e in rest] == [page["data"][0]["id"] - 1]
    assert json.dumps(own).count(mine) == 0  # never the key itself


def test_events_older_than_the_retention_are_pruned(api: TestClient, pg_sessions) -> None:
    with pg_sessions.begin() as session:
        audit.record(session, CLI, "create", "key", "key_recent", "team-audit")
        audit.record(session, CLI, "create", "key", "key_old", "team-audit")
        session.flush()
        session.execute(update(AuditEvent).where(AuditEvent.object_id == "key_old")
                        .values(at=utcnow() - timedelta(days=31)))
    swept = retention.sweep(pg_sessions, budget_s=5, audit_kept_s=30 * 86400)
    assert swept.pruned_events == 1
    assert [r[4] for r in rows(pg_sessions)] == ["key_recent"]
    assert retention.sweep(pg_sessions, budget_s=5, audit_kept_s=0).pruned_events == 0


def test_quotaflow_audit_prints_the_log_through_the_api(
        settings: Settings, pg_sessions, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.api_rate_limit = None
    monkeypatch.setattr(rate_limit, "get_settings", lambda: settings)
    deps.key_cache.cache_clear()
    with pg_sessions.begin() as session:
        session.execute(AuditEvent.__table__.delete())
    made = auth.create_key(pg_sessions, "cli-audit", actor=CLI)
    with api_in_thread(settings, monkeypatch) as (_app, url):
        env = service_env(QUOTAFLOW_API_URL=url, QUOTAFLOW_API_KEY=made.secret,
                          PYTHONPATH=str(ROOT))
        shown = subprocess.run(quotaflow("audit", "--json"), capture_output=True, text=True,
                               timeout=60, cwd=ROOT, env=env)
        table = subprocess.run(quotaflow("audit"), capture_output=True, text=True,
                               timeout=60, cwd=ROOT, env=env)
    assert shown.returncode == 0, shown.stderr
    assert [(e["action"], e["object_id"], e["client"]) for e in json.loads(shown.stdout)] == [
        ("create", made.id, "cli")]
    assert f"cli-audit  (cli)  create key {made.id}  from cli" in table.stdout

"""A job's own caps on every API that creates one (in this process, on the test
database): POST /jobs (form), POST /jobs/jsonl (query), POST /v1/batches (body fields, as
the OpenAI SDK's extra_body sends them, or metadata) and POST /v1/messages/batches
(headers); each is stored on the job, and a bad one is refused naming its parameter."""

import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from quotaflow.config import Settings
from quotaflow.models import Job
from quotaflow.tenants import keys as auth
from tests.harness.api_app import app_client
from tests.harness.factories import chat_line, jsonl

LINES = jsonl([chat_line("a"), chat_line("b")])


@pytest.fixture
def api(settings: Settings, pg_sessions, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    settings.api_rate_limit = None
    yield from app_client(settings, monkeypatch)


def caps_of(sessions, job_id: str) -> tuple[int | None, int | None]:
    with sessions() as session:
        job = session.get_one(Job, job_id)
        return job.max_rpm, job.max_tpm


def test_every_create_stores_the_jobs_caps_and_refuses_a_bad_one(api: TestClient,
                                                                  pg_sessions) -> None:
    headers = {"Authorization": f"Bearer {auth.create_key(pg_sessions, 'capsapi').secret}"}
    form = api.post("/jobs", headers=headers, files={"file": ("f.jsonl", LINES)},
                    data={"max_rpm": "120", "max_tpm": "9000"})
    assert form.status_code == 201, form.text
    assert caps_of(pg_sessions, form.json()["id"]) == (120, 9000)
    body = api.post("/jobs/jsonl?max_rpm=30", headers=headers, content=LINES)
    assert body.status_code == 201, body.text
    assert caps_of(pg_sessions, body.json()["id"]) == (30, None)
    bad = api.post("/jobs", headers=headers, files={"file": ("f.jsonl", LINES)},
                   data={"max_rpm": "0"})
    assert bad.status_code in (400, 422) and "max_rpm" in bad.text

    upload = api.post("/v1/files", headers=headers, data={"purpose": "batch"},
                      files={"file": ("in.jsonl", LINES)})
    assert upload.status_code == 200, upload.text
    batch = {"input_file_id": upload.json()["id"], "endpoint": "/v1/chat/completions"}
    extra = api.post("/v1/batches", headers=headers, json={**batch, "max_rpm": 60})
    assert extra.status_code == 200, extra.text
    assert caps_of(pg_sessions, extra.json()["id"]) == (60, None)
    meta = api.post("/v1/batches", headers=headers,
                    json={**batch, "metadata": {"quotaflow_max_tpm": "5000"}})
    assert meta.status_code == 200, meta.text
    assert caps_of(pg_sessions, meta.json()["id"]) == (None, 5000)
    wrong = api.post("/v1/batches", headers=headers,
                     json={**batch, "metadata": {"quotaflow_max_tpm": "lots"}})
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == (
        "metadata.quotaflow_max_tpm")

    requests = {"requests": [{"custom_id": "m1", "params": {
        "model": "claude-3-5-haiku", "max_tokens": 16,
        "messages": [{"role": "user", "content": "hi"}]}}]}
    anthropic = api.post("/v1/messages/batches", content=json.dumps(requests),
                         headers={**headers, "Content-Type": "application/json",
                                  "X-Quotaflow-Max-Rpm": "45"})
    assert anthropic.status_code == 200, anthropic.text
    with pg_sessions() as session:  # a Message Batch's id is not its job's: the newest job
        newest = session.scalars(select(Job).where(Job.tenant == "capsapi")
                                 .order_by(Job.created_at.desc())).first()
    assert newest is not None and (newest.max_rpm, newest.max_tpm) == (45, None)

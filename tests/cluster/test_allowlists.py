"""Allowlists of models and deployments, on the API served over HTTP in this process: a
line for a model its key (or its tenant) may not use fails `model_not_allowed` naming the
model and is never routed; OpenAI's Batch API (through the openai SDK) and Anthropic's
Message Batches API (through the anthropic SDK) refuse such a batch whole, with a 400
naming the line and the model, and store nothing; a deployments list refuses a route
that could reach another deployment."""

import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from sqlalchemy import func, select

from api import deps, rate_limit
from quotaflow.config import Settings
from quotaflow.models import Item, Job
from quotaflow.tenants import keys as auth
from tests.harness.api_thread import api_in_thread
from tests.harness.factories import chat_line, jsonl

CHAT = "/v1/chat/completions"
DEPLOYMENTS = """
[deployments.cheap]
provider = "mock"
model = "gpt-4o-mini"
rpm = 100000
tpm = 100000000

[deployments.dear]
provider = "mock"
model = "gpt-4o"
rpm = 100000
tpm = 100000000

[deployments.haiku]
provider = "mock"
model = "claude-haiku"
rpm = 100000
tpm = 100000000

[routes]
"both" = { deployments = ["cheap"], fallback = ["dear"] }
"""


@pytest.fixture
def api(settings: Settings, pg_sessions, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "d.toml").write_text(DEPLOYMENTS)
    settings.deployments_file = tmp_path / "d.toml"
    settings.api_rate_limit = None
    settings.api_key_cache_s = 0  # a tenant's new list applies at once
    monkeypatch.setattr(rate_limit, "get_settings", lambda: settings)
    deps.key_cache.cache_clear()
    with api_in_thread(settings, monkeypatch) as (_app, url):
        yield url
    deps.key_cache.cache_clear()


def make_key(sessions, tenant: str = "limited", models: list[str] | None = None,
             deployments: list[str] | None = None) -> str:
    return auth.create_key(sessions, tenant, rules=auth.KeyRules(
        models=models, deployments=deployments)).secret


def lines(*models: str) -> bytes:
    return jsonl([chat_line(f"r{n}", model=model) for n, model in enumerate(models, 1)])


def submit(url: str, secret: str, body: bytes) -> dict:
    made = httpx.post(f"{url}/jobs", headers={"Authorization": f"Bearer {secret}"},
                      files={"file": ("f.jsonl", body)}, timeout=30)
    assert made.status_code == 201, made.text
    return made.json()


def error_lines(url: str, secret: str, job_id: str) -> dict[int, dict]:
    answer = httpx.get(f"{url}/jobs/{job_id}/errors",
                       headers={"Authorization": f"Bearer {secret}"}, timeout=30)
    found = [json.loads(line) for line in answer.raise_for_status().text.splitlines()]
    return {int(line["custom_id"][1:]): line["error"] for line in found}


def unrouted(sessions, job_id: str) -> dict[int, str | None]:
    with sessions() as session:
        return dict(session.execute(select(Item.line_no, Item.route)
                                    .where(Item.job_id == job_id)).all())


def test_a_line_for_a_model_not_allowed_fails_and_is_never_routed(api: str, pg_sessions) -> None:
    secret = make_key(pg_sessions, models=["gpt-4o-mini", "claude-haiku"])
    job = submit(api, secret, lines("gpt-4o-mini", "gpt-4o", "claude-haiku"))
    assert job["request_counts"]["failed"] == 1 and job["request_counts"]["total"] == 3
    errors = error_lines(api, secret, job["id"])
    assert list(errors) == [2] and errors[2]["code"] == "model_not_allowed"
    assert "model 'gpt-4o' is not allowed" in errors[2]["message"]
    assert unrouted(pg_sessions, job["id"]) == {1: "gpt-4o-mini", 2: None, 3: "claude-haiku"}


def test_the_tenants_list_applies_to_its_keys_beside_their_own(api: str, pg_sessions) -> None:
    own = make_key(pg_sessions, "team-lists", models=["gpt-4o-mini", "claude-haiku"])
    plain = make_key(pg_sessions, "team-lists")
    auth.set_tenant_allowlist(pg_sessions, "team-lists", ["gpt-4o-mini"], None)
    for secret in (own, plain):
        job = submit(api, secret, lines("gpt-4o-mini", "claude-haiku"))
        errors = error_lines(api, secret, job["id"])
        assert list(errors) == [2] and errors[2]["code"] == "model_not_allowed"
    auth.set_tenant_allowlist(pg_sessions, "team-lists", None, None, clear=True)
    assert submit(api, plain, lines("gpt-4o", "claude-haiku"))["request_counts"]["failed"] == 0


def test_a_deployments_list_refuses_a_route_that_could_go_elsewhere(api: str,
                                                                   pg_sessions) -> None:
    secret = make_key(pg_sessions, deployments=["cheap", "haiku"])
    job = submit(api, secret, lines("gpt-4o-mini", "both", "gpt-4o", "claude-haiku"))
    errors = error_lines(api, secret, job["id"])
    assert sorted(errors) == [2, 3] and {e["code"] for e in errors.values()} == {
        "model_not_allowed"}
    assert "reaches deployment(s) dear" in errors[2]["message"]
    assert unrouted(pg_sessions, job["id"])[2] is None


def test_the_openai_sdk_gets_a_400_naming_the_line_and_no_batch(api: str, pg_sessions) -> None:
    client = openai.OpenAI(base_url=f"{api}/v1", max_retries=0,
                           api_key=make_key(pg_sessions, models=["gpt-4o-mini"]))
    uploaded = client.files.create(file=("b.jsonl", lines("gpt-4o-mini", "gpt-4o-mini",
                                                          "gpt-4o")), purpose="batch")
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
    error = refused.value.body
    assert refused.value.code == "model_not_allowed", error
    assert "line 3: model 'gpt-4o' is not allowed" in error["message"]
    assert error["data"] == [{"line": 3, "message": error["data"][0]["message"]}]
    assert client.batches.list().data == []
    with pg_sessions() as session:
        assert session.scalar(select(func.count()).select_from(Job)
                              .where(Job.tenant == "limited")) == 0
    good = client.files.create(file=("g.jsonl", lines("gpt-4o-mini")), purpose="batch")
    assert client.batches.create(input_file_id=good.id, endpoint=CHAT,
                                 completion_window="24h").status == "in_progress"


def test_the_anthropic_sdk_gets_a_400_naming_the_request(api: str, pg_sessions) -> None:
    client = anthropic.Anthropic(base_url=api, max_retries=0,
                                 api_key=make_key(pg_sessions, models=["claude-haiku"]))
    requests = [{"custom_id": f"q{n}", "params": {
        "model": model, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}}
        for n, model in enumerate(("claude-haiku", "gpt-4o"))]
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.batches.create(requests=requests)
    body = refused.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "requests.1: model 'gpt-4o' is not allowed" in body["error"]["message"]
    assert client.messages.batches.list().data == []
    made = client.messages.batches.create(requests=requests[:1])
    assert made.processing_status == "in_progress"

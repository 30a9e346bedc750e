"""The strict mock's Bedrock routes, in process: signatures, bodies and limits refused in
Bedrock's own shapes, answers in Converse's and InvokeModel's."""

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from mock_provider.bedrock_checks import AwsKey
from mock_provider.strict import create_app
from quotaflow.deployments.deployment import Deployment
from quotaflow.providers.bedrock_signing import Signer

KEY = AwsKey("AKIDMOCKTEST", "mock-secret", "us-west-2")
MODEL = "anthropic.claude-test-v1:0"
PATH = "model/anthropic.claude-test-v1%3A0/"
CONVERSE = {"messages": [{"role": "user", "content": [{"text": "hello there"}]}],
            "inferenceConfig": {"maxTokens": 20}}


@pytest.fixture
def signer(monkeypatch: pytest.MonkeyPatch) -> Signer:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", KEY.secret)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return Signer(Deployment(name="br", provider="bedrock", model=MODEL, rpm=60, tpm=1000,
                             region=KEY.region, base_url="http://testserver"))


def post(client: TestClient, signer: Signer | None, operation: str, body: Any,
         raw: bytes | None = None) -> Any:
    data = raw if raw is not None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if signer is not None:
        lines = signer.head(PATH + operation, json.dumps(body).encode()).decode().split("\r\n")
        headers |= dict(line.split(": ", 1) for line in lines if line)
    return client.post("/" + PATH + operation, content=data, headers=headers)


def client(rpm: int = 600, tpm: int = 100_000) -> TestClient:
    return TestClient(create_app(rpm=rpm, tpm=tpm, aws_key=KEY))


def test_a_signed_converse_request_is_answered_in_converses_shape(signer: Signer) -> None:
    answer = post(client(), signer, "converse", CONVERSE)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["output"]["message"]["content"] == [{"text": "simulated reply to: hello there"}]
    assert body["stopReason"] == "end_turn" and body["usage"]["inputTokens"] > 0
    assert answer.headers["x-amzn-requestid"]


def test_an_invoke_request_is_answered_with_a_message(signer: Signer) -> None:
    body = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 20,
            "messages": [{"role": "user", "content": "hi"}]}
    answer = post(client(), signer, "invoke", body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["type"] == "message" and answer.json()["model"] == MODEL
    refused = post(client(), signer, "invoke", {**body, "model": MODEL})
    assert refused.status_code == 400 and "extraneous key [model]" in refused.json()["message"]


def test_a_missing_or_wrong_signature_is_a_403(signer: Signer) -> None:
    unsigned = post(client(), None, "converse", CONVERSE)
    assert unsigned.status_code == 403
    assert unsigned.headers["x-amzn-errortype"].startswith("MissingAuthenticationTokenException")
    tampered = post(client(), signer, "converse", CONVERSE,
                    raw=json.dumps({**CONVERSE, "system": [{"text": "x"}]}).encode())
    assert tampered.status_code == 403
    assert tampered.headers["x-amzn-errortype"].startswith("InvalidSignatureException")
    assert "signature we calculated does not match" in tampered.json()["message"]


@pytest.mark.parametrize(("body", "why"), [
    ({"messages": [{"role": "assistant", "content": [{"text": "x"}]}]}, "start with a user"),
    ({"messages": [{"role": "user", "content": [{"text": "a"}]},
                   {"role": "user", "content": [{"text": "b"}]}]}, "alternate"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}]},
     "exactly one member"),
    ({**CONVERSE, "inferenceConfig": {"max_tokens": 5}}, "extraneous key [max_tokens]"),
    ({**CONVERSE, "modelId": MODEL}, "extraneous key [modelId]"),
    ({"messages": [{"role": "user", "content": [{"document": {
        "name": "a.pdf", "format": "pdf", "source": {"bytes": "JVBERi0="}}}]}]}, "name"),
])
def test_a_body_bedrock_refuses_is_a_validation_exception(
        signer: Signer, body: dict[str, Any], why: str) -> None:
    answer = post(client(), signer, "converse", body)
    assert answer.status_code == 400
    assert answer.headers["x-amzn-errortype"].startswith("ValidationException")
    assert why in answer.json()["message"]


def test_over_the_limits_is_a_throttling_exception(signer: Signer) -> None:
    mock = client(rpm=60, tpm=1000)  # one request a second, the burst a minute's
    statuses = [post(mock, signer, "converse", CONVERSE).status_code for _ in range(62)]
    assert statuses.count(200) in (60, 61) and statuses[-1] == 429
    refused = post(mock, signer, "converse", CONVERSE)
    assert refused.status_code == 429 and refused.json() == {
        "message": "Too many requests, please wait before trying again."}
    assert refused.headers["x-amzn-errortype"].startswith("ThrottlingException")
    assert mock.get("/stats").json()["rejected_429"] >= 2

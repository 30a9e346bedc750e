"""SigV4 as the bedrock provider signs and the strict mock checks it, credentials from AWS's
chain, and Bedrock's errors read as rate limiting, retryable or permanent."""

import sys
from datetime import UTC, datetime, timedelta

import pytest
from starlette.datastructures import Headers

from mock_provider.bedrock_checks import AwsKey, signature_problem
from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import ConfigError, PermanentProviderError, RetryableProviderError
from quotaflow.providers.bedrock import BedrockProvider
from quotaflow.providers.bedrock_signing import Signer

KEY = AwsKey("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "eu-west-1")
PATH = "model/anthropic.claude-test-v1%3A0/converse"
BODY = b'{"messages": []}'


@pytest.fixture(autouse=True)
def aws_environment(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Only the test's credentials: none from the machine's files or roles."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION",
                 "AWS_DEFAULT_REGION", "AWS_BEARER_TOKEN_BEDROCK",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY.access_key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", KEY.secret)


def deployment(**extra: object) -> Deployment:
    fields = {"name": "br", "provider": "bedrock", "model": "anthropic.claude-test-v1:0",
              "rpm": 60, "tpm": 100_000, "region": KEY.region, **extra}
    return Deployment(**fields)  # type: ignore[arg-type]


def signed_headers(signer: Signer, body: bytes = BODY) -> Headers:
    """The headers as they arrive: the pool's Host and Content-Type, the signer's lines."""
    lines = signer.head(PATH, body).decode().strip().split("\r\n")
    extra = dict(line.split(": ", 1) for line in lines)
    host = signer.base_url.split("://", 1)[1].rstrip("/")
    return Headers({"host": host, "content-type": "application/json", **extra})


def test_the_mock_recomputes_the_signature_and_accepts_it() -> None:
    signer = Signer(deployment(base_url="http://127.0.0.1:8123"))
    headers = signed_headers(signer)
    assert headers["authorization"].startswith(
        f"AWS4-HMAC-SHA256 Credential={KEY.access_key_id}/")
    assert f"/{KEY.region}/bedrock/aws4_request" in headers["authorization"]
    assert signature_problem(KEY, headers, "/" + PATH, "", BODY) is None


def test_a_wrong_secret_a_changed_body_and_an_old_date_are_refused() -> None:
    signer = Signer(deployment(base_url="http://127.0.0.1:8123"))
    headers = signed_headers(signer)
    wrong = AwsKey(KEY.access_key_id, "not-the-secret", KEY.region)
    assert signature_problem(wrong, headers, "/" + PATH, "", BODY)[0] == (  # type: ignore[index]
        "InvalidSignatureException")
    assert signature_problem(KEY, headers, "/" + PATH, "", b'{"messages": [1]}') is not None
    assert signature_problem(KEY, headers, "/model/other/converse", "", BODY) is not None
    later = datetime.now(UTC) + timedelta(minutes=20)
    assert "expired" in signature_problem(KEY, headers, "/" + PATH, "", BODY,  # type: ignore
                                          now=later)[1]
    other = AwsKey("AKIDOTHER", KEY.secret, KEY.region)
    assert signature_problem(other, headers, "/" + PATH, "", BODY)[0] == (  # type: ignore[index]
        "UnrecognizedClientException")


def test_temporary_credentials_sign_their_session_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SESSION_TOKEN", "session-token")
    headers = signed_headers(Signer(deployment(base_url="http://127.0.0.1:8123")))
    assert headers["x-amz-security-token"] == "session-token"
    assert "x-amz-security-token" in headers["authorization"]
    assert signature_problem(KEY, headers, "/" + PATH, "", BODY) is None


def test_the_region_names_the_endpoint_and_comes_from_the_environment_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert Signer(deployment()).base_url == "https://bedrock-runtime.eu-west-1.amazonaws.com/"
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")
    assert Signer(deployment(region=None)).region == "ap-south-1"
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    with pytest.raises(ConfigError, match="no region"):
        Signer(deployment(region=None))


def test_a_profile_from_the_shared_files_signs(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    (tmp_path / "credentials").write_text(
        f"[batch]\naws_access_key_id = {KEY.access_key_id}\n"
        f"aws_secret_access_key = {KEY.secret}\n")
    signer = Signer(deployment(aws_profile="batch", base_url="http://127.0.0.1:8123"))
    assert signature_problem(KEY, signed_headers(signer), "/" + PATH, "", BODY) is None
    with pytest.raises(ConfigError, match="AWS credentials"):
        Signer(deployment(aws_profile="missing"))


def test_no_credentials_or_no_botocore_is_a_configuration_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(ConfigError, match="found no AWS credentials"):
        BedrockProvider(deployment())
    monkeypatch.setitem(sys.modules, "botocore.session", None)
    with pytest.raises(ConfigError, match=r"quotaflow\[bedrock\]"):
        BedrockProvider(deployment())


def test_an_api_key_is_sent_as_a_bearer_token_without_signing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QF_BEDROCK_KEY", "bedrock-api-key")
    provider = BedrockProvider(deployment(api_key_env="QF_BEDROCK_KEY"))
    assert provider._signer is None


@pytest.mark.parametrize(("status", "kind", "error", "seen_as"), [
    (429, "ThrottlingException", RetryableProviderError, 429),
    (429, "ModelNotReadyException", RetryableProviderError, 429),
    (503, "ServiceUnavailableException", RetryableProviderError, 429),
    (408, "ModelTimeoutException", RetryableProviderError, 408),
    (500, "InternalServerException", RetryableProviderError, 500),
    (400, "ValidationException", PermanentProviderError, 400),
    (403, "AccessDeniedException", PermanentProviderError, 403),
])
def test_bedrocks_errors_are_read_by_their_exception(
        status: int, kind: str, error: type, seen_as: int) -> None:
    provider = BedrockProvider(deployment())
    headers = {"x-amzn-errortype": f"{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/",
               "x-amzn-requestid": "req-1"}
    with pytest.raises(error) as caught:
        provider._interpret(status, headers, None, b'{"message": "no"}')
    assert type(caught.value) is error and caught.value.status_code == seen_as
    assert f"HTTP {status} {kind}: no" in str(caught.value)


def test_an_answer_carries_its_request_id_and_usage() -> None:
    provider = BedrockProvider(deployment())
    answer = (b'{"output": {"message": {"role": "assistant", "content": [{"text": "hi"}]}},'
              b' "stopReason": "end_turn", "usage": {"inputTokens": 7, "outputTokens": 2,'
              b' "totalTokens": 9}, "metrics": {"latencyMs": 3}}')
    response = provider._interpret(200, {"x-amzn-requestid": "req-9"}, None, answer)
    assert (response.request_id, response.prompt_tokens, response.completion_tokens) == (
        "req-9", 7, 2)
    assert response.answer_format == "anthropic" and response.raw is None
    assert response.body["content"] == [{"type": "text", "text": "hi"}]

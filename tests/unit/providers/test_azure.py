"""Azure OpenAI's pure parts: URLs, error bodies, Entra tokens; a deployment's own headers
and query, resolved from the environment and never shown."""

import asyncio
import logging
import time
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from quotaflow.deployments.deployment import Deployment
from quotaflow.deployments.extras import EnvValue, query_string, resolve, with_query
from quotaflow.errors import (
    ConfigError,
    PermanentProviderError,
    RetryableProviderError,
)
from quotaflow.providers.azure import (
    AzureProvider,
    azure_base,
    azure_error,
    azure_path,
    message_wait,
)
from quotaflow.providers.entra import EntraToken

KEY_ENV = "QF_UNIT_AZURE_KEY"


def azure(**fields: Any) -> Deployment:
    given: dict[str, Any] = {"name": "az", "provider": "azure", "model": "gpt-4o-east",
                             "base_url": "https://res.openai.azure.com",
                             "api_version": "2024-10-21", "rpm": 60, "tpm": 10_000}
    return Deployment(**{**given, **fields})


def test_the_deployment_name_path_carries_the_model_and_the_api_version() -> None:
    d = azure()
    assert azure_base(d) == "https://res.openai.azure.com/openai/deployments/gpt-4o-east/"
    assert azure_path(d, "/v1/chat/completions") == "chat/completions?api-version=2024-10-21"
    assert azure_path(d, "/v1/embeddings") == "embeddings?api-version=2024-10-21"
    # base_url given with /openai, or a trailing slash, and a name that needs quoting
    spaced = azure(base_url="https://res.openai.azure.com/openai/", model="my model")
    assert azure_base(spaced) == "https://res.openai.azure.com/openai/deployments/my%20model/"


def test_the_v1_path_needs_no_api_version() -> None:
    d = azure(base_url="https://res.openai.azure.com/openai/v1/", api_version=None)
    assert d.azure_v1
    assert azure_base(d) == "https://res.openai.azure.com/openai/v1/"
    assert azure_path(d, "/v1/chat/completions") == "chat/completions"
    preview = azure(base_url="https://res.openai.azure.com/openai/v1", api_version="preview")
    assert azure_path(preview, "/v1/chat/completions") == "chat/completions?api-version=preview"


@pytest.mark.parametrize(("fields", "message"), [
    ({"api_version": None}, "provider 'azure' needs api_version"),
    ({"base_url": None}, "provider 'azure' needs base_url"),
    ({"query": {"api-version": "x"}}, "set api-version with api_version"),
    ({"headers": {"Content-Length": "1"}}, "set by quotaflow"),
    ({"headers": {"bad name": "1"}}, "not a valid header name"),
    ({"headers": {"X-A": "one\r\nX-B: two"}}, "holds a line break"),
    ({"headers": {"X-A": {"env": "V", "other": 1}}}, "headers.X-A"),
])
def test_bad_azure_tables_are_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        azure(**fields)


def test_kinds_without_http_calls_take_no_headers() -> None:
    with pytest.raises(ValidationError, match="makes no HTTP calls"):
        Deployment(name="m", provider="mock", model="m", rpm=60, tpm=1000,
                   headers={"X-A": "1"})


def test_env_named_values_are_read_at_call_time_and_a_missing_one_names_its_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    values = {"X-Tenant": EnvValue(env="QF_UNIT_TENANT"), "X-Plain": "p"}
    monkeypatch.setenv("QF_UNIT_TENANT", "t-secret")
    assert resolve(values, "az", "header") == {"X-Tenant": "t-secret", "X-Plain": "p"}
    monkeypatch.setenv("QF_UNIT_TENANT", "rotated")
    assert resolve(values, "az", "header")["X-Tenant"] == "rotated"
    monkeypatch.delenv("QF_UNIT_TENANT")
    with pytest.raises(ConfigError, match=r"reads header 'X-Tenant' from \$QF_UNIT_TENANT"):
        resolve(values, "az", "header")
    monkeypatch.setenv("QF_UNIT_TENANT", "evil\r\nX-Injected: 1")
    with pytest.raises(ConfigError) as error:
        resolve(values, "az", "header")
    assert "line break" in str(error.value) and "evil" not in str(error.value)


def test_query_strings_are_encoded_and_appended() -> None:
    assert query_string({"a b": "c&d", "e": "/f"}) == "a%20b=c%26d&e=%2Ff"
    assert with_query("chat/completions", "x=1") == "chat/completions?x=1"
    assert with_query("chat/completions?api-version=v", "x=1") == (
        "chat/completions?api-version=v&x=1")
    assert with_query("p", "") == "p"


def test_azure_error_bodies_are_read_in_both_shapes() -> None:
    assert azure_error({"error": {"code": "429", "message": "slow down"}}) == ("429", "slow down")
    assert azure_error({"error": {"code": "content_filter", "message": "filtered",
                                  "innererror": {"code": "ResponsibleAIPolicyViolation"}}}
                       ) == ("content_filter/ResponsibleAIPolicyViolation", "filtered")
    assert azure_error({"statusCode": 401, "message": "Access denied"}) == (None, "Access denied")
    assert azure_error("not json") == (None, None)
    assert message_wait("... Please retry after 6 seconds. Please contact ...") == 6.0
    assert message_wait("Please retry after 1 second.") == 1.0
    assert message_wait(None) is None


def provider(monkeypatch: pytest.MonkeyPatch, **fields: Any) -> AzureProvider:
    monkeypatch.setenv(KEY_ENV, "azure-unit-key")
    return AzureProvider(azure(api_key_env=KEY_ENV, **fields))


def test_an_azure_429_without_retry_after_waits_what_its_message_says(
        monkeypatch: pytest.MonkeyPatch) -> None:
    body = (b'{"error": {"code": "429", "message": "Requests to the ChatCompletions_Create '
            b'Operation ... Please retry after 7 seconds. Please contact Azure support."}}')
    with pytest.raises(RetryableProviderError) as error:
        provider(monkeypatch)._interpret(429, {"apim-request-id": "apim-1"}, None, body)
    assert error.value.retry_after == 7.0 and error.value.request_id == "apim-1"
    assert str(error.value).startswith("az: HTTP 429: Requests to the ChatCompletions_Create")
    # retry-after-ms, where sent, is what counts
    with pytest.raises(RetryableProviderError) as error:
        provider(monkeypatch)._interpret(429, {"retry-after-ms": "250"}, None, body)
    assert error.value.retry_after == 0.25


def test_azure_codes_are_named_and_4xx_are_permanent(monkeypatch: pytest.MonkeyPatch) -> None:
    body = (b'{"error": {"code": "DeploymentNotFound", "message": "The API deployment for '
            b'this resource does not exist."}}')
    with pytest.raises(PermanentProviderError) as error:
        provider(monkeypatch)._interpret(404, {"x-request-id": "r-9"}, None, body)
    assert "HTTP 404: DeploymentNotFound: The API deployment" in str(error.value)
    assert error.value.request_id == "r-9"


def test_answers_read_the_rate_limit_headers_and_the_request_id(
        monkeypatch: pytest.MonkeyPatch) -> None:
    raw = (b'{"object": "chat.completion", "choices": [], "usage": {"prompt_tokens": 3, '
           b'"completion_tokens": 4, "total_tokens": 7}}')
    answer = provider(monkeypatch)._interpret(200, {
        "x-ratelimit-remaining-requests": "9", "x-ratelimit-remaining-tokens": "900",
        "apim-request-id": "apim-2"}, None, raw)
    assert (answer.remaining_requests, answer.remaining_tokens) == (9.0, 900.0)
    assert (answer.prompt_tokens, answer.completion_tokens, answer.request_id) == (3, 4, "apim-2")


def test_the_key_goes_in_api_key_with_the_deployments_headers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QF_UNIT_TENANT", "t-1")
    edge = provider(monkeypatch, headers={"X-Tenant": {"env": "QF_UNIT_TENANT"}},
                    query={"r": "east"})._edge
    assert edge._head_for("azure-unit-key") == b"api-key: azure-unit-key\r\n"
    assert edge._extras_head == b"X-Tenant: t-1\r\n" and edge._query == "r=east"


class Credential:
    """azure-identity's get_token, counted."""

    def __init__(self, lifetime_s: float = 3600, fail: Exception | None = None) -> None:
        self.calls, self.lifetime_s, self.fail = 0, lifetime_s, fail

    def get_token(self, *scopes: str) -> Any:
        self.calls += 1
        assert scopes == ("https://cognitiveservices.azure.com/.default",)
        if self.fail is not None:
            raise self.fail
        return SimpleNamespace(token=f"tok-{self.calls}",
                               expires_on=int(time.time() + self.lifetime_s))


def test_one_token_is_fetched_for_many_calls_and_again_before_it_expires() -> None:
    fresh, expiring = Credential(), Credential(lifetime_s=60)

    async def heads(credential: Credential) -> list[bytes]:
        token = EntraToken("az", credential)
        return list(await asyncio.gather(*(token.head() for _ in range(20))))

    assert set(asyncio.run(heads(fresh))) == {b"Authorization: Bearer tok-1\r\n"}
    assert fresh.calls == 1
    asyncio.run(heads(expiring))  # within five minutes of its end: fetched again each time
    assert expiring.calls == 20


class CredentialUnavailableError(Exception):
    """Named as azure-identity's."""


def test_no_credential_is_permanent_and_a_failing_endpoint_retryable() -> None:
    with pytest.raises(PermanentProviderError, match="no Entra ID credential"):
        asyncio.run(EntraToken("az", Credential(fail=CredentialUnavailableError("none"))).head())
    with pytest.raises(RetryableProviderError, match="Entra ID token: OSError: down"):
        asyncio.run(EntraToken("az", Credential(fail=OSError("down"))).head())


def test_secrets_never_reach_the_log(monkeypatch: pytest.MonkeyPatch,
                                     caplog: pytest.LogCaptureFixture) -> None:
    """The error an Azure 401 becomes (and so its log line) holds no key, header or token."""
    monkeypatch.setenv("QF_UNIT_TENANT", "tenant-secret")
    azure_provider = provider(monkeypatch, headers={"X-Tenant": {"env": "QF_UNIT_TENANT"}})
    body = b'{"error": {"code": "401", "message": "Access denied due to invalid subscription key"}}'
    caplog.set_level(logging.DEBUG)
    with pytest.raises(PermanentProviderError) as error:
        azure_provider._interpret(401, {}, None, body)
    logging.getLogger("quotaflow.execution.attempts").warning("%s", error.value)
    text = caplog.text + str(error.value) + repr(error.value.body)
    assert "azure-unit-key" not in text and "tenant-secret" not in text


def test_every_http_kind_sends_the_deployments_headers_and_query(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch kinds' SDK clients and the anthropic provider as well as azure's."""
    from quotaflow.offload.clients import make_client
    from quotaflow.providers.anthropic import AnthropicProvider

    monkeypatch.setenv("QF_UNIT_TENANT", "t-2")
    extra: dict[str, Any] = {"headers": {"X-Tenant": {"env": "QF_UNIT_TENANT"},
                                         "anthropic-version": "2099-01-01"},
                             "query": {"r": "west"}, "rpm": 60, "tpm": 10_000}
    for kind in ("openai-batch", "anthropic-batch"):
        client = make_client(Deployment(name=kind, provider=kind, model="m",
                                        base_url="http://127.0.0.1:9/v1", **extra))
        try:
            assert client.client.default_headers["X-Tenant"] == "t-2"  # type: ignore[attr-defined]
            assert client.client._custom_query == {"r": "west"}  # type: ignore[attr-defined]
        finally:
            client.close()
    claude = AnthropicProvider(Deployment(name="c", provider="anthropic", model="m",
                                          base_url="http://127.0.0.1:9", **extra))
    edge = claude._edge
    assert edge._extras_head == b"X-Tenant: t-2\r\nanthropic-version: 2099-01-01\r\n"
    assert "anthropic-version" not in edge._headers  # the deployment's replaces the kind's


def test_an_azure_batch_deployment_writes_azures_batch_lines(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QF_TEST_AZURE_BATCH_UNIT_KEY", "k")
    from quotaflow.offload.azure_batches import AzureBatches
    from quotaflow.offload.clients import make_client

    table: dict[str, Any] = dict(name="azb", provider="azure-batch", model="gpt-4o-batch",
                                 base_url="https://r.openai.azure.com", api_version="2024-10-21",
                                 api_key_env="QF_TEST_AZURE_BATCH_UNIT_KEY")
    client = make_client(Deployment(**table))
    try:
        assert isinstance(client, AzureBatches)
        line = client.request_line(7, "/v1/chat/completions", {
            "model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})
        assert line == {"custom_id": "q7", "method": "POST", "url": "/chat/completions",
                        "body": {"model": "gpt-4o-batch",
                                 "messages": [{"role": "user", "content": "hi"}]}}
        assert str(client.client.base_url) == "https://r.openai.azure.com/openai/"
    finally:
        client.close()
    for wrong in ({"base_url": "https://r.openai.azure.com/openai/v1"}, {"api_version": None}):
        with pytest.raises(ValidationError, match="'azure-batch' needs the resource's endpoint"):
            Deployment(**{**table, **wrong})

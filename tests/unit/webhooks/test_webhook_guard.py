"""Unit tests of the webhook parts that need no server: the server-side request forgery
guard, the checks of an endpoint's events and URL, the secret derivation and the
settings that tune delivery."""

import ipaddress
from datetime import UTC, datetime

import pytest
from pydantic import SecretStr
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from quotaflow.config import WEBHOOK_RETRY_SCHEDULE_S, Settings
from quotaflow.errors import InvalidParameter, NotConfigured
from quotaflow.webhooks import EVENT_TYPES, guard, signing
from quotaflow.webhooks.endpoints import parse_events

LOOPBACK = [ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128")]
KEY = SecretStr("k" * 40)


@pytest.mark.parametrize(("url", "words"), [
    ("http://127.0.0.1:8000/hook", "127.0.0.1 is a loopback address"),
    ("http://10.0.0.5/hook", "10.0.0.5 is a private address"),
    ("http://192.168.1.1/", "private address"),
    ("http://172.16.0.1/", "private address"),
    ("http://169.254.169.254/latest/meta-data/", "link-local address (a cloud metadata address)"),
    ("http://[::1]:8000/", "::1 is a loopback address"),
    ("http://[fe80::1]/", "fe80::1 is a link-local address"),
    ("http://[fd00::1]/", "private address"),
    ("http://0.0.0.0:8000/", "unspecified address"),
    ("http://224.0.0.1/", "multicast address"),
    ("http://[::ffff:127.0.0.1]/", "loopback address"),
    ("http://localhost:8000/hook", "host 'localhost' resolves to 127.0.0.1, a loopback address"),
])
def test_non_public_addresses_are_refused_by_default(url: str, words: str) -> None:
    with pytest.raises(guard.UnsafeUrl) as refused:
        guard.resolve(url, ())
    assert words in str(refused.value)
    assert "QUOTAFLOW_WEBHOOK_ALLOWED_NETWORKS" in str(refused.value)
    assert refused.value.param == "url"


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/hook", "http://localhost:9/hook",
                                 "https://[::1]:9/hook", "http://[::ffff:127.0.0.1]:9/"])
def test_allowed_networks_let_loopback_through(url: str) -> None:
    target = guard.resolve(url, LOOPBACK)
    assert target.address.is_loopback or target.address.ipv4_mapped.is_loopback
    assert target.port == 9


def test_an_allowed_network_allows_only_itself() -> None:
    with pytest.raises(guard.UnsafeUrl, match=r"169\.254\.169\.254"):
        guard.resolve("http://169.254.169.254/", LOOPBACK)


def test_a_public_address_is_the_one_to_connect_to() -> None:
    target = guard.resolve("https://8.8.8.8/hooks?a=1", ())
    assert (target.scheme, target.host, target.port, str(target.address)) == (
        "https", "8.8.8.8", 443, "8.8.8.8")


@pytest.mark.parametrize(("url", "words"), [
    ("", "url is empty"),
    ("ftp://example.com/x", "scheme 'ftp' is not allowed"),
    ("file:///etc/passwd", "scheme 'file' is not allowed"),
    ("gopher://8.8.8.8/", "scheme 'gopher' is not allowed"),
    ("example.com/hook", "scheme '(none)' is not allowed"),
    ("http:///nohost", "names no host"),
    ("http://user:pw@8.8.8.8/", "user name or password"),
    ("http://8.8.8.8:99999/", "not a valid URL"),
    ("http://8.8.8.8/a b", "printable ASCII"),
    ("http://8.8.8.8/\x00", "printable ASCII"),
    ("http://ex\u00e4mple.com/", "punycode"),
    ("http://8.8.8.8/" + "a" * 3000, "longer than 2048"),
    ("http://no-such-host.invalid/", "cannot be resolved"),
])
def test_bad_urls_are_refused_with_the_reason(url: str, words: str) -> None:
    with pytest.raises(InvalidParameter) as refused:
        guard.resolve(url, LOOPBACK)
    assert words in str(refused.value)


def test_events_are_checked_by_name() -> None:
    assert parse_events(None) == list(EVENT_TYPES)
    assert parse_events(["batch.failed", "batch.failed", " batch.expired"]) == [
        "batch.failed", "batch.expired"]
    with pytest.raises(InvalidParameter, match=r"unknown event 'batch\.done'") as unknown:
        parse_events(["batch.completed", "batch.done"])
    assert unknown.value.param == "events"
    with pytest.raises(InvalidParameter, match="events is empty"):
        parse_events([])


def test_the_secret_is_derived_from_the_key_and_verifies_a_signature() -> None:
    secret = signing.endpoint_secret(KEY, "we_1")
    assert secret.startswith("whsec_")
    assert secret == signing.endpoint_secret(KEY, "we_1")
    assert secret != signing.endpoint_secret(KEY, "we_2")
    assert secret != signing.endpoint_secret(SecretStr("j" * 40), "we_1")
    body = '{"object":"event"}'
    headers = signing.signed_headers(secret, "msg_1", body, datetime.now(UTC))
    assert Webhook(secret).verify(body, headers) == {"object": "event"}
    with pytest.raises(WebhookVerificationError):
        Webhook(signing.endpoint_secret(KEY, "we_2")).verify(body, headers)


def test_no_key_or_a_short_one_says_what_to_set_and_never_echoes_it() -> None:
    with pytest.raises(NotConfigured, match="set QUOTAFLOW_WEBHOOK_SECRET_KEY"):
        signing.endpoint_secret(None, "we_1")
    with pytest.raises(NotConfigured, match="too short") as short:
        signing.endpoint_secret(SecretStr("hunter2-hunter2"), "we_1")
    assert "hunter2" not in str(short.value)


def test_the_settings_read_a_schedule_and_networks_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings(_env_file=None).webhook_retry_schedule_s == WEBHOOK_RETRY_SCHEDULE_S
    assert sum(WEBHOOK_RETRY_SCHEDULE_S) >= 24 * 3600  # retried for a day
    monkeypatch.setenv("QUOTAFLOW_WEBHOOK_RETRY_SCHEDULE_S", "0, 0.5,2")
    monkeypatch.setenv("QUOTAFLOW_WEBHOOK_ALLOWED_NETWORKS", "127.0.0.0/8, ::1")
    settings = Settings(_env_file=None)
    assert settings.webhook_retry_schedule_s == (0.0, 0.5, 2.0)
    assert [str(n) for n in settings.webhook_allowed_networks] == ["127.0.0.0/8", "::1/128"]

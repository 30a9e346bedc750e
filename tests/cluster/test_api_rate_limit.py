"""The API's per-key request limit (api/rate_limit.py), on a real Redis, the API in this
process: over the limit a key gets 429 with Retry-After and the RateLimit headers in the
route's error shape while another key is served; /healthz is never limited; with
QUOTAFLOW_AUTH=off a client address is the bucket; a Redis that cannot be reached lets
requests through. Across two API processes and the window's end:
tests/cluster/test_api_processes.py."""

import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from api import rate_limit
from quotaflow.config import Settings
from quotaflow.tenants import keys as auth
from tests.harness.api_app import app_client
from tests.harness.servers import REDIS_URL, flush_redis, redis_keys

LIMIT, WINDOW_S = 5, 30  # a window no test outlasts


def client_for(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setattr(rate_limit, "get_settings", lambda: settings)
    yield from app_client(settings, monkeypatch)


@pytest.fixture
def api(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    flush_redis(REDIS_URL)
    settings.api_rate_limit = f"{LIMIT}/{WINDOW_S} seconds"
    yield from client_for(settings, monkeypatch)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_a_key_over_its_limit_gets_429_while_another_key_is_served(api, pg_sessions) -> None:
    noisy = auth.create_key(pg_sessions, "noisy").secret
    quiet = auth.create_key(pg_sessions, "quiet").secret
    if WINDOW_S - time.time() % WINDOW_S < 5:  # not across a window's end
        time.sleep(WINDOW_S - time.time() % WINDOW_S + 0.05)
    served = [api.get("/jobs", headers=bearer(noisy)) for _ in range(LIMIT)]
    assert [a.status_code for a in served] == [200] * LIMIT
    assert [a.headers["RateLimit-Remaining"] for a in served] == [
        str(LIMIT - n) for n in range(1, LIMIT + 1)]
    assert served[0].headers["RateLimit-Limit"] == str(LIMIT)
    assert served[0].headers["RateLimit-Policy"] == f"{LIMIT};w={WINDOW_S}"
    assert 1 <= int(served[0].headers["RateLimit-Reset"]) <= WINDOW_S
    refused = api.get("/jobs", headers=bearer(noisy))
    assert refused.status_code == 429
    assert 1 <= int(refused.headers["Retry-After"]) <= WINDOW_S
    assert refused.headers["RateLimit-Remaining"] == "0"
    assert refused.headers["x-request-id"].startswith("req_")
    error = refused.json()["error"]
    assert error["code"] == "rate_limit_exceeded" and f"{LIMIT} per {WINDOW_S} s" in (
        error["message"])
    # The same key in Anthropic's header is the same bucket, answered in Anthropic's shape.
    anthropic = api.get("/v1/messages/batches", headers={"x-api-key": noisy})
    assert anthropic.status_code == 429 and "Retry-After" in anthropic.headers
    assert anthropic.json()["type"] == "error"
    assert anthropic.json()["error"]["type"] == "rate_limit_error"
    # Another tenant's reads, and health checks, go on.
    assert api.get("/jobs", headers=bearer(quiet)).status_code == 200
    for _ in range(LIMIT + 2):
        health = api.get("/healthz")
        assert health.status_code == 200 and "RateLimit-Limit" not in health.headers
    # The key is counted by its digest: it is nowhere in Redis.
    assert not any(noisy.encode() in k for k in redis_keys("*"))


def test_without_auth_each_client_address_is_a_bucket(settings, monkeypatch) -> None:
    flush_redis(REDIS_URL)
    settings.auth, settings.api_rate_limit = False, f"{LIMIT}/{WINDOW_S} seconds"
    for api in client_for(settings, monkeypatch):
        statuses = [api.get("/jobs").status_code for _ in range(LIMIT + 1)]
        assert statuses[-1] == 429, statuses


def test_the_limit_off_counts_nothing(settings, monkeypatch) -> None:
    settings.api_rate_limit = None
    for api in client_for(settings, monkeypatch):
        answer = api.get("/healthz")
        assert answer.status_code == 200 and "RateLimit-Limit" not in answer.headers


def test_an_unreachable_redis_lets_requests_through(settings, monkeypatch, caplog) -> None:
    settings.auth, settings.api_rate_limit = False, "1/60 seconds"
    unreachable = "redis://127.0.0.1:1/0"
    monkeypatch.setattr(rate_limit, "meter_for", lambda s: rate_limit.Meter(
        rate_limit.parse_rate(s.api_rate_limit), unreachable))
    for api in client_for(settings, monkeypatch):
        began = time.monotonic()
        answers = [api.get("/jobs") for _ in range(5)]
        assert all(a.status_code != 429 and a.status_code < 500 for a in answers), [
            a.status_code for a in answers]
        assert time.monotonic() - began < 3  # asked once, not on every request
    assert sum("not enforced" in r.getMessage() for r in caplog.records) == 1

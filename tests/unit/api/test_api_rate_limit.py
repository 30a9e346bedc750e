"""The per-key request limit's parts that need no server: its setting, the bucket a
request counts against, the headers, the URL the `limits` storage is given."""

import pytest
from pydantic import ValidationError

from api.rate_limit import Count, storage_for, who
from quotaflow.config import Settings


def scope(headers: dict[str, str], client: str = "10.0.0.7") -> dict:
    return {"type": "http", "client": (client, 5000),
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}


def test_the_setting_takes_limits_notation_or_off() -> None:
    assert Settings(_env_file=None).api_rate_limit == "100/10 seconds"
    assert Settings(api_rate_limit="600/minute", _env_file=None).api_rate_limit == "600/minute"
    for off in ("off", "", "0", "none"):
        assert Settings(api_rate_limit=off, _env_file=None).api_rate_limit is None
    for bad in ("lots", "100 per fortnight", "0/minute"):
        with pytest.raises(ValidationError, match="api_rate_limit"):
            Settings(api_rate_limit=bad, _env_file=None)


def test_a_key_is_its_bucket_whichever_header_carries_it() -> None:
    bearer = who(scope({"Authorization": "Bearer sk-one"}))
    assert bearer == who(scope({"x-api-key": "sk-one"}, client="10.9.9.9"))
    assert bearer.startswith("key:") and "sk-one" not in bearer
    assert bearer != who(scope({"Authorization": "Bearer sk-two"}))
    assert who(scope({})) == "addr:10.0.0.7"  # no key: the client address
    assert who(scope({"Authorization": "Basic abc"})) == "addr:10.0.0.7"


def test_the_headers_say_what_is_left_and_when_it_resets() -> None:
    count = Count(limit=100, used=42, window_s=10, reset_s=7)
    assert count.allowed and count.headers() == {
        "RateLimit-Limit": "100", "RateLimit-Remaining": "58", "RateLimit-Reset": "7",
        "RateLimit-Policy": "100;w=10"}
    over = Count(limit=100, used=101, window_s=10, reset_s=3)
    assert not over.allowed and over.headers()["RateLimit-Remaining"] == "0"


def test_quotaflows_redis_urls_become_the_async_storages_of_limits() -> None:
    assert type(storage_for("redis://127.0.0.1:6379/3")).__name__ == "RedisStorage"
    assert type(storage_for("rediss://127.0.0.1:6379/3")).__name__ == "RedisStorage"

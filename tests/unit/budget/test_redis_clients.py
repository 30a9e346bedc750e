"""QUOTAFLOW_REDIS_URL naming a Redis Cluster, and what a cluster asks of the scripts:
each call's keys in one slot, and no key a script reaches that its caller did not name."""

import re
from pathlib import Path

import pytest
from redis.cluster import ClusterNode
from redis.crc import key_slot

from quotaflow import redis_clients
from quotaflow.budget.buckets import bucket_key
from quotaflow.budget.caps import cap_key
from quotaflow.budget.circuit import circuit_key
from quotaflow.budget.fair_share import SLOTS_KEY, fair_key
from quotaflow.config import Settings, get_settings
from quotaflow.errors import ConfigError
from quotaflow.redis_urls import check_url, is_cluster_url

LUA = Path(redis_clients.__file__).parent / "budget" / "lua"


@pytest.mark.parametrize("url", ["redis+cluster://127.0.0.1:7000",
                                 "rediss+cluster://user:secret@a:7000,b:7001/0"])
def test_a_cluster_is_named_by_its_scheme(url: str) -> None:
    assert is_cluster_url(url) and check_url(url) == url
    assert Settings(redis_url=url, _env_file=None).limiter_url == url


def test_every_seed_node_is_used() -> None:
    assert redis_clients._seeds("redis+cluster://u:p@a:7000,[::1]:7001,b") == [
        ClusterNode("a", 7000), ClusterNode("::1", 7001), ClusterNode("b", 6379)]


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/3", "rediss://h:6380/0",
                                 "unix:///run/redis.sock"])
def test_a_single_redis_is_still_plain(url: str) -> None:
    assert not is_cluster_url(url) and check_url(url) == url


@pytest.mark.parametrize(("url", "reason"), [
    ("redis+cluster://h:7000/3", "only database 0"),
    ("redis+cluster://", "at least one node"),
    ("redis+cluster://h:port", "'h:port' is not host:port"),
    ("memcached://h:11211", "unknown scheme 'memcached'"),
    ("rediss+cluster://h:7000?ssl_cert_reqs=none", "takes no ?options"),
])
def test_an_unusable_url_says_why(url: str, reason: str) -> None:
    with pytest.raises(ValueError, match=re.escape(reason)):
        check_url(url)


def test_the_broker_cannot_be_a_cluster() -> None:
    with pytest.raises(ValueError, match="Celery's broker must be one Redis"):
        Settings(broker_url="redis+cluster://h:7000", _env_file=None)


def test_a_bad_url_is_named_but_never_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUOTAFLOW_REDIS_URL", "redis+cluster://ops:hunter2@h:7000/5")
    get_settings.cache_clear()
    try:
        with pytest.raises(ConfigError) as raised:
            get_settings()
    finally:
        get_settings.cache_clear()
    assert "QUOTAFLOW_REDIS_URL: Value error, a Redis Cluster has only database 0" in str(
        raised.value)
    assert "hunter2" not in str(raised.value)


@pytest.mark.parametrize("name", ["gpt-4o", "eu/claude", "x{y}z", ""])
def test_each_script_call_keeps_its_keys_in_one_slot(name: str) -> None:
    # fair.lua is called with two keys: a cluster refuses them (CROSSSLOT) unless one slot.
    assert key_slot(fair_key(name).encode()) == key_slot(SLOTS_KEY.encode())
    # One key each, but tagged, so a deployment's budget and circuit stay whole.
    assert bucket_key(name).startswith("{") and circuit_key(name).startswith("{")
    # A cap's hash is taken with its deployment's in one call (bucket.lua): one slot.
    assert key_slot(cap_key(name, "tenant:a").encode()) == key_slot(bucket_key(name).encode())


@pytest.mark.parametrize("script", sorted(LUA.glob("*.lua")), ids=lambda p: p.name)
def test_scripts_touch_only_the_keys_they_are_given(script: Path) -> None:
    # A key a script builds itself may live on another master: a cluster refuses it.
    calls = re.findall(r"redis\.call\(\s*['\"](\w+)['\"]\s*(?:,\s*([^,)]+))?", script.read_text())
    assert calls
    for command, first in calls:
        if command.upper() == "TIME":
            continue
        # bucket.lua's caps: each one's key is read from KEYS where the caps are parsed.
        given = first.strip() == "cap.key" and "key = KEYS[#caps + 2]" in script.read_text()
        assert given or first.strip() == "key" or re.fullmatch(r"KEYS\[\d\]", first.strip()), (
            command, first)

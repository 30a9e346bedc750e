"""What a key may do, decided without a server: scopes and their order, which scope each
route needs, durations, allowlists against a deployments file, expiry of a remembered
key, and last use written at most once a minute per key."""

from datetime import timedelta

import pytest

from api.scopes import needed
from quotaflow.deployments.catalog import Deployments
from quotaflow.errors import InvalidParameter, KeyExpired, ScopeDenied
from quotaflow.tenants import key_cache
from quotaflow.tenants.grants import Allowlist, Grant, Scope, names, parse_duration
from quotaflow.tenants.key_cache import KeyCache


def catalog() -> Deployments:
    mock = {"provider": "mock", "rpm": 1000, "tpm": 100000}
    return Deployments.model_validate({
        "deployments": {"cheap": {**mock, "name": "cheap", "model": "gpt-4o-mini"},
                        "dear": {**mock, "name": "dear", "model": "gpt-4o"}},
        "routes": {"both": {"deployments": ["cheap"], "fallback": ["dear"]}}})


def test_scopes_are_ordered_and_named() -> None:
    assert Scope.READ < Scope.SUBMIT < Scope.ADMIN
    assert Scope.named("Submit") is Scope.SUBMIT and Scope.ADMIN.label == "admin"
    with pytest.raises(InvalidParameter, match="read, submit or admin"):
        Scope.named("write")


@pytest.mark.parametrize(("method", "path", "scope"), [
    ("GET", "/jobs", Scope.READ), ("GET", "/v1/files/file-1/content", Scope.READ),
    ("GET", "/webhooks", Scope.READ), ("POST", "/jobs", Scope.SUBMIT),
    ("POST", "/jobs/batch_1/cancel", Scope.SUBMIT), ("DELETE", "/v1/files/f", Scope.SUBMIT),
    ("POST", "/v1/messages/batches", Scope.SUBMIT), ("POST", "/webhooks", Scope.ADMIN),
    ("DELETE", "/webhooks/we_1", Scope.ADMIN), ("GET", "/audit", Scope.ADMIN),
    ("POST", "/webhooksx", Scope.SUBMIT)])
def test_each_route_needs_the_scope_its_method_and_path_say(method: str, path: str,
                                                           scope: Scope) -> None:
    assert needed(method, path) is scope


def test_durations_take_seconds_minutes_hours_and_days() -> None:
    assert parse_duration("30d") == timedelta(days=30)
    assert [parse_duration(t) for t in ("45s", "15m", "12h")] == [
        timedelta(seconds=45), timedelta(minutes=15), timedelta(hours=12)]
    for wrong in ("", "30", "1w", "-1h", "1.5h"):
        with pytest.raises(InvalidParameter, match="is not a duration"):
            parse_duration(wrong)


def test_an_allowlist_is_the_key_and_the_tenant_together() -> None:
    assert names(" b, a,,a ") == ("a", "b") and names(None) is None
    both = Allowlist.of((["gpt-4o-mini", "gpt-4o"], None), (["gpt-4o-mini", "x"], ["cheap"]))
    assert both == Allowlist(frozenset({"gpt-4o-mini"}), frozenset({"cheap"}))
    assert not Allowlist.of((None, None), (None, None)).limits


def test_a_model_outside_the_list_is_refused_naming_it() -> None:
    allow = Allowlist(models=frozenset({"gpt-4o-mini"}))
    assert allow.refusal("gpt-4o-mini", "gpt-4o-mini", catalog()) is None
    refused = allow.refusal("gpt-4o", "gpt-4o", catalog())
    assert refused is not None and "'gpt-4o'" in refused and "gpt-4o-mini" in refused


def test_a_route_that_could_reach_another_deployment_is_refused() -> None:
    allow = Allowlist(deployments=frozenset({"cheap"}))
    assert allow.refusal("gpt-4o-mini", "gpt-4o-mini", catalog()) is None
    # its fallback reaches `dear`: never sent there, so refused here
    refused = allow.refusal("both", "both", catalog())
    assert refused is not None and "dear" in refused
    assert allow.refusal("gpt-4o", "gpt-4o", catalog()) is not None


def test_an_expired_key_says_when_and_a_rotated_one_names_its_successor() -> None:
    grant = Grant("key_1", "t", False, Scope.READ, expires_at=1_000_000_000.0)
    grant.check_live(999_999_999.0)
    with pytest.raises(KeyExpired, match=r"key_1 expired at 2001-09-09 01:46:40 UTC"):
        grant.check_live(1_000_000_000.0)
    rotated = Grant("key_1", "t", False, Scope.READ, 10.0, replaced_by="key_2")
    with pytest.raises(KeyExpired, match="rotated \\(replaced by key key_2\\)"):
        rotated.check_live(11.0)


def test_a_scope_too_low_names_both_scopes() -> None:
    grant = Grant("key_1", "t", False, Scope.READ)
    grant.require(Scope.READ, "GET /jobs")
    with pytest.raises(ScopeDenied) as refused:
        grant.require(Scope.SUBMIT, "POST /jobs")
    assert (refused.value.have, refused.value.needed) == ("read", "submit")
    assert "scope 'read'; POST /jobs needs scope 'submit'" in str(refused.value)


def test_a_remembered_key_is_refused_once_it_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    wall = [100.0]
    cache = KeyCache(ttl_s=300, clock=lambda: 0.0, wall=lambda: wall[0])
    monkeypatch.setattr(key_cache, "hash_key", lambda _secret: "digest")
    cache._grants["digest"] = (300.0, Grant("key_1", "t", False, Scope.ADMIN, 150.0))
    assert cache.cached("qf-x") is not None
    wall[0] = 150.0
    with pytest.raises(KeyExpired):
        cache.cached("qf-x")


def test_last_use_is_due_once_a_minute_per_key() -> None:
    now = [0.0]
    cache = KeyCache(ttl_s=5, clock=lambda: now[0])
    assert cache.touch_due("key_1") and cache.touch_due("key_2")
    now[0] = 59.0
    assert not cache.touch_due("key_1")
    now[0] = 60.0
    assert cache.touch_due("key_1") and not cache.touch_due("key_1")

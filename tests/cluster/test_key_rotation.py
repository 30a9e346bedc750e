"""Rotation without a gap, on the API served over HTTP in this process: while clients send
requests in a loop, `quotaflow keys rotate` prints a new key with the old one's tenant,
scope and allowlists; the old key keeps being served until its grace period ends (no
request fails, before or after the clients move to the new key), then gets 401 naming
its successor."""

import subprocess
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import select

from api import deps, rate_limit
from quotaflow.config import Settings
from quotaflow.models import ApiKey
from quotaflow.tenants import keys as auth
from quotaflow.tenants.grants import Scope
from tests.harness.api_thread import api_in_thread
from tests.harness.procs import quotaflow
from tests.harness.servers import ROOT, service_env

GRACE_S = 6


@pytest.fixture
def api(settings: Settings, pg_sessions, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    settings.api_rate_limit = None
    settings.api_key_cache_s = 1.0  # a rotation's grace end is seen within this
    monkeypatch.setattr(rate_limit, "get_settings", lambda: settings)
    deps.key_cache.cache_clear()
    with api_in_thread(settings, monkeypatch) as (_app, url):
        yield url
    deps.key_cache.cache_clear()


class Poller:
    """Sends GET /v1/batches in a loop with whichever key `secret` holds, keeping every
    answer's status."""

    def __init__(self, url: str, secret: str) -> None:
        self.url, self.secret = url, secret
        self.statuses: list[tuple[str, int]] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as client:
            while not self._stop.is_set():
                secret = self.secret
                answer = client.get("/v1/batches", headers={"Authorization": f"Bearer {secret}"})
                self.statuses.append((secret, answer.status_code))
                if answer.status_code != 200:
                    self.failures.append(f"{time.monotonic():.2f} {answer.text}")
                time.sleep(0.01)

    def stop(self) -> list[tuple[str, int]]:
        self._stop.set()
        self._thread.join(10)
        return self.statuses


def rotate(pg_url: str, key_id: str) -> str:
    done = subprocess.run(quotaflow("keys", "rotate", key_id, "--grace", f"{GRACE_S}s"),
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env=service_env(QUOTAFLOW_DATABASE_URL=pg_url, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr
    assert key_id in done.stderr and "works for" in done.stderr
    return done.stdout.strip()  # the new key, alone on stdout


def test_rotation_serves_every_request_until_the_grace_ends(api: str, pg_sessions,
                                                             pg_url: str) -> None:
    old = auth.create_key(pg_sessions, "rotating", rules=auth.KeyRules(
        Scope.SUBMIT, models=["gpt-4o-mini"], deployments=["cheap"]))
    mover = Poller(api, old.secret)  # a client that moves to the new key
    stayer = Poller(api, old.secret)  # one that has not moved yet
    try:
        time.sleep(0.5)
        new_secret = rotate(pg_url, old.id)
        assert new_secret.startswith(auth.KEY_PREFIX) and new_secret != old.secret
        with pg_sessions() as session:
            grace_end = session.get(ApiKey, old.id).expires_at.timestamp()
        assert grace_end - time.time() <= GRACE_S  # counted from the rotation
        time.sleep(0.5)
        mover.secret = new_secret
        # the old key is served to the end of its grace
        time.sleep(max(0.0, grace_end - 0.3 - time.time()))
        stayed = stayer.stop()
        time.sleep(max(0.0, grace_end + 1.5 - time.time()))  # past the grace and the cache
        moved = mover.stop()
    finally:
        stayer.stop()
        mover.stop()
    assert len(stayed) > 50 and {status for _, status in stayed} == {200}, stayer.failures[:3]
    assert {status for _, status in moved} == {200}, mover.failures[:3]
    assert {secret for secret, _ in moved} == {old.secret, new_secret}
    # past the grace, the old key is refused, naming the key that replaced it
    with pg_sessions() as session:
        new_row = session.scalars(select(ApiKey).where(
            ApiKey.key_hash == auth.hash_key(new_secret))).one()
        old_row = session.get(ApiKey, old.id)
    refused = httpx.get(f"{api}/v1/batches", headers={"Authorization": f"Bearer {old.secret}"})
    assert refused.status_code == 401
    error = refused.json()["error"]
    assert error["code"] == "expired_api_key"
    assert f"replaced by key {new_row.id}" in error["message"], error["message"]
    # the new key acts as the old one did: same tenant, scope and allowlists
    assert old_row.replaced_by == new_row.id
    assert (new_row.tenant, new_row.scope, new_row.allowed_models, new_row.allowed_deployments
            ) == ("rotating", "submit", ["gpt-4o-mini"], ["cheap"])
    assert new_row.expires_at is None
    again = subprocess.run(quotaflow("keys", "rotate", old.id), capture_output=True, text=True,
                           timeout=60, cwd=ROOT, env=service_env(
                               QUOTAFLOW_DATABASE_URL=pg_url, PYTHONPATH=str(ROOT)))
    assert again.returncode != 0 and f"already rotated, to {new_row.id}" in again.stderr

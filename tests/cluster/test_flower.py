"""`quotaflow flower` is closed by default: it will not start without basic auth unless
told to with --no-auth, and with basic auth its pages, not only its API, ask for it."""

import subprocess
from pathlib import Path

import httpx

from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import REDIS_URL, service_env

AUTH = ("watcher", "flower-secret-42")


def flower_env(**extra: str) -> dict[str, str]:
    # Flower needs only the broker (this session's Redis db); it reads nothing else.
    return service_env(QUOTAFLOW_BROKER_URL=REDIS_URL, **extra)


def test_flower_refuses_to_start_without_basic_auth(tmp_path: Path) -> None:
    for extra, told in (({}, "or pass --no-auth"),
                        ({"QUOTAFLOW_FLOWER_BASIC_AUTH": "no-colon"}, "must be user:password")):
        refused = subprocess.run(quotaflow("flower", "--port", str(free_port())),
                                 env=flower_env(**extra), cwd=tmp_path, capture_output=True,
                                 text=True, timeout=60)
        assert refused.returncode == 78, refused.stderr  # EX_CONFIG
        assert "QUOTAFLOW_FLOWER_BASIC_AUTH" in refused.stderr and told in refused.stderr
        assert "Traceback" not in refused.stderr


def test_flower_pages_ask_for_the_password(tmp_path: Path) -> None:
    port = free_port()
    flower = Proc("flower-auth", quotaflow("flower", "--port", str(port)),
                  flower_env(QUOTAFLOW_FLOWER_BASIC_AUTH=":".join(AUTH)), tmp_path)
    try:
        url = f"http://127.0.0.1:{port}"
        flower.wait_http(f"{url}/healthcheck")
        for page in ("/", "/workers", "/tasks", "/api/workers"):
            assert httpx.get(url + page, timeout=15).status_code == 401, page
        assert httpx.get(f"{url}/workers", auth=AUTH, timeout=15).status_code == 200
    finally:
        flower.stop()
    assert AUTH[1] not in flower.log_path.read_text(errors="replace")


def test_no_auth_serves_flower_open_with_a_warning(tmp_path: Path) -> None:
    port = free_port()
    flower = Proc("flower-open", quotaflow("flower", "--port", str(port), "--no-auth"),
                  flower_env(), tmp_path)
    try:
        url = f"http://127.0.0.1:{port}"
        flower.wait_http(f"{url}/healthcheck")
        assert httpx.get(f"{url}/workers", timeout=15).status_code == 200
    finally:
        flower.stop()
    assert "runs without a password (--no-auth)" in flower.log_path.read_text(errors="replace")

"""`quotaflow api` and `quotaflow worker` check their settings before serving (issue 30,
part 4): started with a setting that cannot work, each ends at once with one message
naming every problem, exit status 78 (EX_CONFIG) and no traceback, instead of serving
and failing each request (the API used to answer every submit with HTTP 500 when
QUOTAFLOW_BROKER_URL was unset)."""

import subprocess
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from cli import exit_codes
from tests.harness.procs import free_port, quotaflow
from tests.harness.servers import PG_URL, recreate_database, service_env

pytestmark = pytest.mark.timeout(180)

KEYED = '''[deployments.keyed]
provider = "openai"
base_url = "http://127.0.0.1:9/v1"
model = "gpt-4o-mini"
api_key_env = "QF_PREFLIGHT_UNSET_KEY"
rpm = 60
tpm = 100000
'''


def start(command: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Start the service as an operator would; it must exit by itself, quickly."""
    argv = quotaflow(command, "--port", str(free_port())) if command == "api" else quotaflow(
        command, "--concurrency", "1", "--name", "preflight@qftest")
    return subprocess.run(argv, env=service_env(**env), cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)


def assert_refused(result: subprocess.CompletedProcess[str], service: str,
                   *problems: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == exit_codes.CONFIG, output
    assert "Traceback" not in output, output
    assert f"error: quotaflow {service} cannot start:" in result.stderr, output
    for problem in problems:
        assert problem in result.stderr, output
    assert result.stderr.count("cannot start") == 1  # one message, every problem in it


@pytest.mark.parametrize("service", ["api", "worker"])
def test_no_broker_is_refused_at_start(service: str, pg_url: str, tmp_path: Path) -> None:
    result = start(service, tmp_path, QUOTAFLOW_DATABASE_URL=pg_url)
    assert_refused(result, service, "QUOTAFLOW_BROKER_URL is not set")


@pytest.mark.parametrize("service", ["api", "worker"])
def test_unreachable_broker_and_database_are_both_named(service: str, tmp_path: Path) -> None:
    closed = free_port()
    result = start(service, tmp_path,
                   QUOTAFLOW_DATABASE_URL=f"postgresql://postgres:hunter2@127.0.0.1:{closed}/qf",
                   QUOTAFLOW_BROKER_URL=f"redis://127.0.0.1:{closed}/0")
    assert_refused(result, service,
                   f"the database at postgresql+psycopg://postgres:***@127.0.0.1:{closed}/qf "
                   "cannot be reached",
                   f"QUOTAFLOW_BROKER_URL: the Redis at redis://127.0.0.1:{closed}/0 cannot be "
                   "reached")
    assert "hunter2" not in result.stdout + result.stderr  # a password is never echoed


@pytest.mark.parametrize("service", ["api", "worker"])
def test_a_broken_deployments_file_is_refused(service: str, pg_url: str, redis_url: str,
                                              tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("[deployments.x\nprovider = ")
    result = start(service, tmp_path, QUOTAFLOW_DATABASE_URL=pg_url,
                   QUOTAFLOW_BROKER_URL=redis_url, QUOTAFLOW_DEPLOYMENTS_FILE=str(broken))
    assert_refused(result, service, f"deployments file {broken} is not valid TOML")


@pytest.mark.parametrize("service", ["api", "worker"])
def test_a_key_the_deployments_name_must_be_set(service: str, pg_url: str, redis_url: str,
                                                tmp_path: Path) -> None:
    deployments = tmp_path / "keyed.toml"
    deployments.write_text(KEYED)
    result = start(service, tmp_path, QUOTAFLOW_DATABASE_URL=pg_url,
                   QUOTAFLOW_BROKER_URL=redis_url, QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments))
    assert_refused(result, service, "deployment 'keyed' reads its API key from "
                                    "$QF_PREFLIGHT_UNSET_KEY, which is not set")


def test_invalid_settings_are_refused_without_a_traceback(tmp_path: Path) -> None:
    result = start("api", tmp_path, QUOTAFLOW_TASK_TIME_LIMIT_S="7200")
    output = result.stdout + result.stderr
    assert result.returncode == exit_codes.CONFIG, output
    assert "Traceback" not in output
    assert "invalid QUOTAFLOW_* setting" in result.stderr
    assert "must be below visibility_timeout_s" in result.stderr


def test_a_database_never_migrated_says_to_migrate(redis_url: str, tmp_path: Path) -> None:
    empty = make_url(PG_URL).set(database=f"{make_url(PG_URL).database}_empty")
    url = empty.render_as_string(hide_password=False)
    recreate_database(url)  # a database nobody ran `quotaflow db upgrade` on
    result = start("worker", tmp_path, QUOTAFLOW_DATABASE_URL=url,
                   QUOTAFLOW_BROKER_URL=redis_url)
    assert_refused(result, "worker", "has no quotaflow schema: run `quotaflow db upgrade`")

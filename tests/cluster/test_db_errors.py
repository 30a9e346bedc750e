"""A database quotaflow cannot use says what to do, as the commands print it."""

import subprocess
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.harness.procs import quotaflow
from tests.harness.servers import PG_URL, recreate_database, service_env


def _empty_postgres() -> str:
    url = make_url(PG_URL).set(database=f"{make_url(PG_URL).database}_empty")
    text = url.render_as_string(hide_password=False)
    recreate_database(text)
    return text


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_a_database_without_the_schema_says_to_migrate(tmp_path: Path, kind: str) -> None:
    # Given a database nobody ran `quotaflow db upgrade` on
    url = f"sqlite:///{tmp_path / 'empty.db'}" if kind == "sqlite" else _empty_postgres()
    # When an operator lists the API keys in it
    done = subprocess.run(quotaflow("keys", "list"), env=service_env(QUOTAFLOW_DATABASE_URL=url),
                          capture_output=True, text=True, timeout=60)
    # Then the command fails with the one thing to do, and no traceback (78: configuration)
    assert done.returncode == 78
    assert "run `quotaflow db upgrade`" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_unreachable_database_names_the_setting_to_check() -> None:
    done = subprocess.run(
        quotaflow("keys", "list"),
        env=service_env(QUOTAFLOW_DATABASE_URL="postgresql://postgres@127.0.0.1:1/nothing"),
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 4  # a service it needs is unreachable (cli/exit_codes.py)
    assert "database unreachable" in done.stderr and "QUOTAFLOW_DATABASE_URL" in done.stderr

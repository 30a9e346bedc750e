"""The servers the tests share, and what a child process of theirs gets.

The tests use their own PostgreSQL database (quotaflow_test) and Redis db (15), or those
QUOTAFLOW_TEST_DATABASE_URL / QUOTAFLOW_TEST_REDIS_URL name, and never touch anything
else on the servers. Under pytest-xdist (scripts/test runs two processes) each process has
a database and a Redis db of its own: gw0 the names given, gw1 "<database>_gw1" and the
Redis db below. bench/ makes its own databases with `recreate_database` too.
"""

import os
from pathlib import Path

import psycopg
import redis
from sqlalchemy.engine import make_url

XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_WORKER_INDEX = int(XDIST_WORKER[2:]) if XDIST_WORKER.startswith("gw") else 0


def _own_database(url: str) -> str:
    if not _WORKER_INDEX:
        return url
    parsed = make_url(url)
    return parsed.set(database=f"{parsed.database}_{XDIST_WORKER}").render_as_string(
        hide_password=False)


def _own_redis_db(url: str) -> str:
    base, _, db = url.rpartition("/")
    return f"{base}/{(int(db or 0) - _WORKER_INDEX) % 16}" if _WORKER_INDEX else url


PG_URL = _own_database(os.environ.get(
    "QUOTAFLOW_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/quotaflow_test"))
REDIS_URL = _own_redis_db(os.environ.get("QUOTAFLOW_TEST_REDIS_URL", "redis://127.0.0.1:6379/15"))
# The repository's root: where the tests find deploy/, examples/, migrations and the code a
# child process imports.
ROOT = Path(__file__).resolve().parents[2]


def recreate_database(url: str) -> None:
    """Drop the database `url` names (ending its sessions) and create it again, empty:
    quotaflow.db.upgrade migrates it."""
    parsed = make_url(url)
    admin = parsed.set(drivername="postgresql", database="postgres")
    dsn = admin.render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{parsed.database}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{parsed.database}"')


def service_env(**extra: str) -> dict[str, str]:
    """The environment for a child process: ours, minus any QUOTAFLOW_* of the developer's.
    The API's per-key request limit is off unless a test sets it: the tests and benchmarks
    send from one address and one key far faster than a tenant may
    (tests/cluster/test_api_rate_limit.py tests the limit itself)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUOTAFLOW_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["QUOTAFLOW_API_RATE_LIMIT"] = "off"
    env.update(extra)
    return env


def flush_redis(url: str = REDIS_URL) -> None:
    """Empty a test's Redis db, closing the connection: a client left to the collector
    warns (ResourceWarning) inside whichever test happens to be running."""
    with redis.Redis.from_url(url) as client:
        client.flushdb()


def redis_keys(pattern: str, url: str = REDIS_URL) -> list[bytes]:
    with redis.Redis.from_url(url) as client:
        return list(client.keys(pattern))

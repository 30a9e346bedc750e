"""Settings checked before `quotaflow api` or `quotaflow worker` serves anything.

Without this, an API started with no broker answered every submit with HTTP 500
("QUOTAFLOW_BROKER_URL is not set"), and a worker whose deployment's key variable was
unset failed each batch: configuration errors found per request, by users, instead of
once, by the operator who started the service. So both commands first check what they
depend on (the database reachable and migrated, the broker and the limiter's Redis set
and reachable, the deployments file valid, every key variable it names set) and, when
something is wrong, end with one message listing every problem and exit non-zero.

URLs are shown without their passwords, and keys are never read out: only whether
their variable is set.
"""

import os
from collections.abc import Callable
from pathlib import Path

import redis
from sqlalchemy import create_engine, inspect, make_url, text
from sqlalchemy.exc import SQLAlchemyError

from quotaflow.config import Settings
from quotaflow.db import normalize_url
from quotaflow.deployments.catalog import Deployments
from quotaflow.errors import ConfigError, QuotaflowError, ServiceUnavailable
from quotaflow.redis_clients import UNREACHABLE, connect

CONNECT_TIMEOUT_S = 5
MIGRATIONS_TABLE = "alembic_version"


def shown_url(url: str) -> str:
    """The URL with its password replaced by ***: safe for a message or a log."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy parses: show its scheme only
        return url.split("://", 1)[0] + "://..."


def check_database(url: str) -> str | None:
    """None when the database answers and has quotaflow's schema; else what is wrong."""
    url = normalize_url(url)
    args = {"connect_timeout": CONNECT_TIMEOUT_S} if url.startswith("postgresql") else {}
    try:
        parsed = make_url(url)
    except Exception as exc:  # not a URL at all
        return f"QUOTAFLOW_DATABASE_URL is not a database URL: {exc}"
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:") \
            and not Path(parsed.database).exists():
        # Connecting would create an empty file: say what to do instead.
        return (f"the database file {parsed.database} does not exist: run "
                "`quotaflow db upgrade` (or set QUOTAFLOW_DATABASE_URL)")
    try:
        engine = create_engine(url, connect_args=args)
    except Exception as exc:  # a malformed URL or a driver that is not installed
        return f"QUOTAFLOW_DATABASE_URL ({shown_url(url)}) is unusable: {exc}"
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
            migrated = inspect(connection).has_table(MIGRATIONS_TABLE)
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
        return f"the database at {shown_url(url)} cannot be reached: {reason}"
    finally:
        engine.dispose()
    if not migrated:
        return (f"the database at {shown_url(url)} has no quotaflow schema: run "
                "`quotaflow db upgrade`")
    return None


_REDIS_FAILED: tuple[type[Exception], ...] = (redis.RedisError, ServiceUnavailable, *UNREACHABLE)


def check_redis(variable: str, url: str) -> str | None:
    """None when the Redis at `url` answers PING; else what is wrong."""
    try:  # the limiter's may be a Redis Cluster (redis_clients.py), the broker's never
        client = connect(url, socket_connect_timeout=CONNECT_TIMEOUT_S,
                         socket_timeout=CONNECT_TIMEOUT_S)
        client.ping()
    except ValueError as exc:  # not a redis:// URL
        return f"{variable} ({shown_url(url)}) is not a Redis URL: {exc}"
    except _REDIS_FAILED as exc:
        return f"{variable}: the Redis at {shown_url(url)} cannot be reached: {exc}"
    finally:
        if "client" in locals():
            client.close()
    return None


def check_deployments(settings: Settings, only: str | None = None
                      ) -> tuple[Deployments | None, list[str]]:
    """The deployments file loaded, or its problem; and every key variable it names unset
    (of deployment `only`, for a worker that serves that one alone)."""
    try:
        deployments = settings.load_deployments()
    except QuotaflowError as exc:
        return None, [str(exc)]
    missing = [f"deployment {d.name!r} reads its API key from ${d.api_key_env}, which is "
               "not set in this environment"
               for d in deployments.deployments.values()
               if d.api_key_env and not os.environ.get(d.api_key_env)
               and only in (None, d.name)]
    return deployments, missing


def problems(settings: Settings, only: str | None = None) -> list[str]:
    """Everything that keeps a service from working, in the order an operator fixes it."""
    found: list[str] = []
    if not settings.broker_url:
        found.append("QUOTAFLOW_BROKER_URL is not set: the API queues batches and the "
                     "workers take them through Redis, e.g. "
                     "QUOTAFLOW_BROKER_URL=redis://127.0.0.1:6379/0")
    checks: list[Callable[[], str | None]] = [lambda: check_database(settings.database_url)]
    if settings.broker_url:
        checks.append(lambda: check_redis("QUOTAFLOW_BROKER_URL", settings.broker_url or ""))
    if settings.redis_url and settings.redis_url != settings.broker_url:
        checks.append(lambda: check_redis("QUOTAFLOW_REDIS_URL", settings.redis_url or ""))
    found += [problem for check in checks if (problem := check()) is not None]
    found += check_deployments(settings, only)[1]
    return found


def ensure_ready(settings: Settings, service: str, only: str | None = None) -> None:
    """Raise one ConfigError naming every problem, or return when `service` can start
    (`only`: the one deployment whose key it needs, a --deployment worker's)."""
    found = problems(settings, only)
    if found:
        listed = "\n".join(f"  - {problem}" for problem in found)
        raise ConfigError(f"{service} cannot start:\n{listed}")

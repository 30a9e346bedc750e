"""Engines, sessions, the schema's upgrade and the database errors a user can act on.

Postgres is the distributed store; SQLite is the embedded one. Both get the schema
from the same Alembic migrations; the statements that differ between them live behind
the storage seam (quotaflow/store/).
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry

from quotaflow import jsoncodec
from quotaflow.errors import ConfigError, ServiceUnavailable

_engines: dict[tuple[int, str], Engine] = {}
# PostgreSQL options of this process's connections; see end_idle_transactions_after.
_pg_options: dict[str, str] = {}
# This process's PostgreSQL pool; see size_pool.
_pool: dict[str, float] = {"pool_size": 5, "max_overflow": 5, "pool_timeout": 30}


def end_idle_transactions_after(seconds: float) -> None:
    """Have PostgreSQL end this process's transactions that wait longer than `seconds`
    for their client (idle_in_transaction_session_timeout), for engines made from now on.

    A worker cut off from the database in the middle of a transaction (its host lost the
    network) holds that transaction's row locks until the server notices the client is
    gone, which TCP keepalive does after about two hours; meanwhile every other worker
    storing results of the same job waits for the lock of the job's spend row
    (quotaflow/tenants/spend.py). The workers' transactions are a few statements sent back to
    back, so one that waits this long has lost its client: the server rolls it back and
    the others carry on; the cut-off worker's own batch stores its answers again once it
    is back (insert-or-ignore). Only the workers set it: the API streams output and
    reads uploads inside transactions that may legitimately wait for a slow client.
    """
    _pg_options["idle_in_transaction_session_timeout"] = str(int(seconds * 1000))


def size_pool(connections: int, overflow: int, timeout_s: float) -> None:
    """Size this process's PostgreSQL pool, for engines made from now on.

    The API sizes it to the requests it works on at once (api/admission.py), so an admitted
    request finds a connection at once; `timeout_s` is then a guard against a route that
    holds more than its share, answered as 503 rather than a 30-second wait."""
    _pool.update(pool_size=connections, max_overflow=overflow, pool_timeout=timeout_s)


def normalize_url(url: str) -> str:
    """Accept the postgres:// spellings users paste and pick the psycopg 3 driver."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def make_engine(url: str) -> Engine:
    url = normalize_url(url)
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30},
                               json_serializer=jsoncodec.dumps_text,
                               json_deserializer=jsoncodec.loads)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    if url.startswith("postgresql"):
        options = " ".join(f"-c {name}={value}" for name, value in _pg_options.items())
        return create_engine(url, pool_pre_ping=True, pool_size=int(_pool["pool_size"]),
                             max_overflow=int(_pool["max_overflow"]),
                             pool_timeout=_pool["pool_timeout"],
                             connect_args={"options": options} if options else {},
                             json_serializer=jsoncodec.dumps, json_deserializer=jsoncodec.loads)
    raise ConfigError(f"QUOTAFLOW_DATABASE_URL {url.split(':')[0]}:// is not supported; "
                      "use postgresql://... or sqlite:///path.db")


def _sqlite_pragmas(dbapi_connection: DBAPIConnection, _record: ConnectionPoolEntry) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def get_engine(url: str) -> Engine:
    """One engine per process and URL: a forked Celery child must not reuse its parent's pool."""
    key = (os.getpid(), url)
    if key not in _engines:
        _engines[key] = make_engine(url)
    return _engines[key]


def session_factory(url: str) -> sessionmaker[Session]:
    return sessionmaker(get_engine(url), expire_on_commit=False)


@contextmanager
def translate_db_errors() -> Iterator[None]:
    """Turn 'cannot connect' and 'no such table' into errors that say what to do."""
    try:
        yield
    except DBAPIError as exc:
        if _schema_missing(exc):
            raise ConfigError(
                "the database has no quotaflow tables (or older ones); run "
                "`quotaflow db upgrade` with this QUOTAFLOW_DATABASE_URL first") from exc
        if not isinstance(exc, OperationalError):
            raise
        raise ServiceUnavailable(
            f"database unreachable ({exc.orig.__class__.__name__}); "
            "check QUOTAFLOW_DATABASE_URL and that the server is running"
        ) from exc


def _schema_missing(exc: DBAPIError) -> bool:
    # 42P01 is PostgreSQL's undefined_table; SQLite says so in words.
    return (getattr(exc.orig, "sqlstate", None) == "42P01"
            or "no such table" in str(exc.orig))


def upgrade(url: str) -> None:
    """Bring the schema to the newest migration; the only way quotaflow changes it."""
    from alembic import command
    from alembic.config import Config

    import migrations

    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    config.set_main_option("sqlalchemy.url", normalize_url(url))
    with translate_db_errors():
        command.upgrade(config, "head")

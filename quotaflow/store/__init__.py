"""The one storage seam: PostgreSQL (postgres.py) and SQLite (sqlite.py) behind one
interface (interface.py), chosen here by the session's database and nowhere else."""

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.store.interface import Store
from quotaflow.store.postgres import POSTGRES
from quotaflow.store.sqlite import SQLITE


def of_bind(bind: Engine | Connection | None) -> Store:
    """The store of an engine: PostgreSQL's own statements, or the portable ones (SQLite's,
    which any other database SQLAlchemy speaks would take too)."""
    return POSTGRES if bind is not None and bind.dialect.name == "postgresql" else SQLITE


def of(session: Session) -> Store:
    """The store the session's database takes."""
    return of_bind(session.get_bind())


def for_sessions(sessions: sessionmaker[Session]) -> Store:
    """The store of a session factory's engine, found once (a worker asks at start)."""
    return of_bind(sessions.kw.get("bind"))

"""Alembic environment: the database URL comes from quotaflow's settings."""

from alembic import context
from sqlalchemy import pool

from quotaflow.config import get_settings
from quotaflow.db import make_engine, normalize_url
from quotaflow.models import Base

config = context.config
url = config.get_main_option("sqlalchemy.url") or normalize_url(get_settings().database_url)


def run_migrations_offline() -> None:
    context.configure(url=url, target_metadata=Base.metadata, literal_binds=True,
                      render_as_batch=url.startswith("sqlite"))
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = make_engine(url)
    engine.pool = pool.NullPool(engine.pool._creator)  # one connection, closed after
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=Base.metadata,
                          render_as_batch=url.startswith("sqlite"))
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()

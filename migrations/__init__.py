"""Alembic migrations: the only way quotaflow's schema changes."""

"""Migration 0017 on a database with data: the open items keep being found (is_open is
computed for the rows already stored), results stay, and it goes back down."""

from pathlib import Path

import psycopg
from alembic import command
from alembic.config import Config
from sqlalchemy.engine import make_url

import migrations
from quotaflow.db import normalize_url
from tests.harness.servers import PG_URL, recreate_database

URL = make_url(PG_URL).set(database=f"{make_url(PG_URL).database}_m0017")
STATUSES = ["pending", "running", "waiting", "succeeded", "failed", "cancelled"]


def _alembic() -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    config.set_main_option("sqlalchemy.url", normalize_url(URL.render_as_string(False)))
    return config


def _connect() -> psycopg.Connection:
    return psycopg.connect(URL.set(drivername="postgresql").render_as_string(False),
                           autocommit=True)


def test_upgrading_a_database_with_items_keeps_their_open_ones_findable() -> None:
    # Given a database at 0016 holding a job with items in every status and a result
    recreate_database(URL.render_as_string(False))
    try:
        command.upgrade(_alembic(), "0016")
        with _connect() as conn:
            conn.execute("INSERT INTO jobs (id, status, queue, endpoint, total, created_at) "
                         "VALUES ('j', 'in_progress', 'bulk', '/v1/chat/completions', 6, now())")
            for line, status in enumerate(STATUSES, 1):
                conn.execute("INSERT INTO items (job_id, line_no, custom_id, body, status, "
                             "attempts) VALUES ('j', %s, %s, '{}', %s, 0)",
                             (line, f"c{line}", status))
            conn.execute("INSERT INTO results (job_id, line_no, request_id, prompt_tokens, "
                         "completion_tokens, created_at) VALUES ('j', 4, 'r', 0, 0, now())")
        # When it is upgraded
        command.upgrade(_alembic(), "head")
        # Then its open items are the pending, running and waiting ones, read through the
        # open-items index, and the result is still there
        with _connect() as conn:
            conn.execute("SET enable_seqscan = off")
            assert [row[0] for row in conn.execute(
                "SELECT line_no FROM items WHERE job_id = 'j' AND is_open "
                "ORDER BY line_no")] == [1, 2, 3]
            plan = "\n".join(row[0] for row in conn.execute(
                "EXPLAIN SELECT line_no FROM items WHERE job_id = 'j' AND is_open"))
            assert "ix_items_job_open" in plan
            conn.execute("UPDATE items SET status = 'succeeded' WHERE line_no = 1")
            assert conn.execute("SELECT count(*) FROM items WHERE is_open").fetchone() == (2,)
            assert conn.execute("SELECT count(*) FROM results").fetchone() == (1,)
        # And it goes back down to 0016 with its data
        command.downgrade(_alembic(), "0016")
        with _connect() as conn:
            assert conn.execute("SELECT count(*) FROM items WHERE status IN "
                                "('pending', 'running', 'waiting')").fetchone() == (2,)
    finally:
        admin = URL.set(drivername="postgresql", database="postgres")
        with psycopg.connect(admin.render_as_string(False), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{URL.database}" WITH (FORCE)')

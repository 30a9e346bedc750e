"""job_tallies: a job's request counts and usage kept by the statements that change them.

A status read used to count the job's items by status and sum its results' usage, so it
cost more the larger the job. On PostgreSQL, statement-level triggers with transition
tables now add each statement's net change to `job_tallies` in the statement's own
transaction: every path that writes items or results (ingest's COPY, claims, stored
chunks, retries, cancel, expiry, dedup, deletion, the providers' Batch APIs) keeps the
tallies exact without knowing of them, and a read sums a few rows.

Rows are keyed by the writing backend (`shard` = pg_backend_pid()): two transactions
never update the same tally row, so workers storing chunks of one job never wait on each
other's row locks nor deadlock on them. A read sums the job's rows per name; names are
item statuses plus `prompt_tokens` and `completion_tokens` (quotaflow/jobs/tallies.py).
SQLite, the embedded single-process store, keeps counting (no transition tables there).

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-28
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_UPSERT = ("ON CONFLICT (job_id, shard, name) DO UPDATE SET n = t.n + excluded.n")

_ITEMS = f"""
CREATE FUNCTION quotaflow_tally_items() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO job_tallies AS t (job_id, shard, name, n)
      SELECT job_id, pg_backend_pid(), status, count(*) FROM new_rows
      GROUP BY job_id, status
    {_UPSERT};
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO job_tallies AS t (job_id, shard, name, n)
      SELECT job_id, pg_backend_pid(), status, -count(*) FROM old_rows
      GROUP BY job_id, status
    {_UPSERT};
  ELSE
    INSERT INTO job_tallies AS t (job_id, shard, name, n)
      SELECT job_id, pg_backend_pid(), status, sum(d) FROM (
        SELECT job_id, status, 1 AS d FROM new_rows
        UNION ALL SELECT job_id, status, -1 FROM old_rows) AS change
      GROUP BY job_id, status HAVING sum(d) <> 0
    {_UPSERT};
  END IF;
  RETURN NULL;
END $$
"""

_RESULTS = f"""
CREATE FUNCTION quotaflow_tally_results() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO job_tallies AS t (job_id, shard, name, n)
      SELECT job_id, pg_backend_pid(), usage.name, sum(usage.n) FROM new_rows,
        LATERAL (VALUES ('prompt_tokens', prompt_tokens::bigint),
                        ('completion_tokens', completion_tokens::bigint)) AS usage(name, n)
      GROUP BY job_id, usage.name HAVING sum(usage.n) <> 0
    {_UPSERT};
  ELSIF TG_OP = 'DELETE' THEN
    INSERT INTO job_tallies AS t (job_id, shard, name, n)
      SELECT job_id, pg_backend_pid(), usage.name, -sum(usage.n) FROM old_rows,
        LATERAL (VALUES ('prompt_tokens', prompt_tokens::bigint),
                        ('completion_tokens', completion_tokens::bigint)) AS usage(name, n)
      GROUP BY job_id, usage.name HAVING sum(usage.n) <> 0
    {_UPSERT};
  ELSE
    INSERT INTO job_tallies AS t (job_id, shard, name, n)
      SELECT job_id, pg_backend_pid(), usage.name, sum(usage.n) FROM (
        SELECT job_id, prompt_tokens::bigint AS p, completion_tokens::bigint AS c FROM new_rows
        UNION ALL SELECT job_id, -prompt_tokens, -completion_tokens FROM old_rows) AS change,
        LATERAL (VALUES ('prompt_tokens', p), ('completion_tokens', c)) AS usage(name, n)
      GROUP BY job_id, usage.name HAVING sum(usage.n) <> 0
    {_UPSERT};
  END IF;
  RETURN NULL;
END $$
"""


def _triggers(table: str, function: str) -> list[str]:
    return [
        f"CREATE TRIGGER {table}_tally_insert AFTER INSERT ON {table} REFERENCING "
        f"NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {function}()",
        f"CREATE TRIGGER {table}_tally_update AFTER UPDATE ON {table} REFERENCING "
        f"OLD TABLE AS old_rows NEW TABLE AS new_rows FOR EACH STATEMENT "
        f"EXECUTE FUNCTION {function}()",
        f"CREATE TRIGGER {table}_tally_delete AFTER DELETE ON {table} REFERENCING "
        f"OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION {function}()",
    ]


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("""
        CREATE TABLE job_tallies (
            job_id varchar(64) NOT NULL,
            shard integer NOT NULL,
            name varchar(32) NOT NULL,
            n bigint NOT NULL,
            PRIMARY KEY (job_id, shard, name))""")
    # Nobody writes while migrations run (quotaflow db upgrade before the new code starts):
    # the tallies of the jobs already stored start as one full count each, in shard 0.
    op.execute("""
        INSERT INTO job_tallies (job_id, shard, name, n)
        SELECT job_id, 0, status, count(*) FROM items GROUP BY job_id, status""")
    op.execute("""
        INSERT INTO job_tallies (job_id, shard, name, n)
        SELECT job_id, 0, usage.name, sum(usage.n) FROM results,
          LATERAL (VALUES ('prompt_tokens', prompt_tokens::bigint),
                          ('completion_tokens', completion_tokens::bigint)) AS usage(name, n)
        GROUP BY job_id, usage.name""")
    op.execute(_ITEMS)
    op.execute(_RESULTS)
    for statement in _triggers("items", "quotaflow_tally_items") + _triggers(
            "results", "quotaflow_tally_results"):
        op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in ("items", "results"):
        for event in ("insert", "update", "delete"):
            op.execute(f"DROP TRIGGER {table}_tally_{event} ON {table}")
    op.execute("DROP FUNCTION quotaflow_tally_items()")
    op.execute("DROP FUNCTION quotaflow_tally_results()")
    op.execute("DROP TABLE job_tallies")

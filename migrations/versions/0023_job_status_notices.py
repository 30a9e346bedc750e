"""Job status notices: NOTIFY quotaflow_jobs with the job's id when its status changes.

A long-poll (`GET /jobs/{id}?wait=N`) waits on its API process's reader of the job,
which looked at the job every QUOTAFLOW_WATCH_INTERVAL_S: a realtime job that ended
was reported up to that interval late. With this trigger every status change, from any
transaction, reaches the API processes listening (api/job_notices.py) as it commits.
It fires only when `status` changes, a few times in a job's life, never per item.
SQLite has no notices; the API reads at its interval there.

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-29
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("""
CREATE FUNCTION quotaflow_job_status_notice() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('quotaflow_jobs', NEW.id);
  RETURN NULL;
END $$""")
    op.execute("""
CREATE TRIGGER jobs_status_notice AFTER UPDATE OF status ON jobs
  FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
  EXECUTE FUNCTION quotaflow_job_status_notice()""")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER jobs_status_notice ON jobs")
    op.execute("DROP FUNCTION quotaflow_job_status_notice()")

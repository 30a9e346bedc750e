"""What every cluster module starts from."""

import pytest
from sqlalchemy import text

from quotaflow.db import get_engine


@pytest.fixture(scope="module", autouse=True)
def no_jobs_left_by_other_modules(pg_url: str) -> None:
    """Each module starts with no jobs. The modules an xdist worker runs share its database,
    and a job another module left in progress is work for every worker this one starts: a
    test that flushes the broker makes them queue its pending items again (thousands, ahead
    of the test's own job), the reaper its stale ones."""
    with get_engine(pg_url).begin() as conn:
        conn.execute(text("TRUNCATE jobs, items, results, broker_runs, spend CASCADE"))

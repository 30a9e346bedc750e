"""What every cluster module starts from, and what every cluster test must leave true."""

from collections.abc import Iterator

import pytest
from sqlalchemy import text

from quotaflow.db import get_engine
from tests.harness.tallies import mismatches


@pytest.fixture(scope="module", autouse=True)
def no_jobs_left_by_other_modules(pg_url: str) -> None:
    """Each module starts with no jobs. The modules an xdist worker runs share its database,
    and a job another module left in progress is work for every worker this one starts: a
    test that flushes the broker makes them queue its pending items again (thousands, ahead
    of the test's own job), the reaper its stale ones."""
    with get_engine(pg_url).begin() as conn:
        conn.execute(text("TRUNCATE jobs, items, results, broker_runs, spend, job_tallies CASCADE"))


@pytest.fixture(autouse=True)
def tallies_exact_after_each_test(pg_url: str) -> Iterator[None]:
    """Every path a cluster test takes through items and results (kill -9 of a worker,
    retries, cancel, expiry, dedup, delete, provider batch offload, Redis and PostgreSQL
    restarts) leaves each job's kept tallies equal to a full recount (migration 0022)."""
    yield
    with get_engine(pg_url).connect() as conn:
        wrong = mismatches(conn)
    assert not wrong, f"job_tallies differ from a recount (job, name, kept, counted): {wrong}"

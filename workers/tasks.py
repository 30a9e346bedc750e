"""The batch task: claim, call, store, finish — all in quotaflow.execution."""

from functools import lru_cache

from celery import Task

from quotaflow.config import get_settings
from quotaflow.constants import TASK_PROCESS_BATCH
from quotaflow.db import session_factory
from quotaflow.execution import BatchExecutor
from quotaflow.jobs import BatchRef
from quotaflow.ratelimit import make_limiter
from workers.app import app


@lru_cache
def executor() -> BatchExecutor:
    """Built once per worker process, after the fork, so no pool is shared across processes."""
    settings = get_settings()
    return BatchExecutor(session_factory(settings.database_url), settings.load_deployments(),
                         make_limiter(settings.limiter_url), settings)


@app.task(name=TASK_PROCESS_BATCH, bind=True, max_retries=None)
def process_batch(self: Task, job_id: str, first_line: int, last_line: int) -> dict[str, int]:
    report = executor().run(BatchRef(job_id, first_line, last_line))
    if report.retry_in is not None:
        # Items wait for budget, or are leased by another worker (look again when
        # its lease runs out, in case that worker died).
        raise self.retry(countdown=report.retry_in)
    return {"claimed": report.claimed, "succeeded": report.succeeded, "failed": report.failed}

"""The batch task: claim, call, store, finish — all in quotaflow.execution."""

import logging
from functools import lru_cache
from typing import Any

from celery import Task
from celery.concurrency.thread import TaskPool as ThreadsPool
from celery.signals import worker_init, worker_ready, worker_shutdown
from sqlalchemy import text

from quotaflow.config import get_settings
from quotaflow.constants import TASK_PROCESS_BATCH
from quotaflow.db import translate_db_errors
from quotaflow.dispatch.queues import BatchRef
from quotaflow.errors import ConfigError, ServiceUnavailable
from quotaflow.execution import loops
from quotaflow.execution.loops import PROVIDERS
from quotaflow.providers.local import (
    close_engines,
    close_when_told,
    runner_for,
    serve_only,
)
from quotaflow.runtime import Runtime
from workers import metrics, rounds  # metrics: its signal handlers serve --metrics-port
from workers.app import app
from workers.dispatch import CeleryDispatcher


@lru_cache
def runtime() -> Runtime:
    """Built once per worker process, after the fork, so no pool is shared across processes."""
    return Runtime(get_settings(), CeleryDispatcher, metrics=metrics.collected())


@worker_init.connect
def load_local_model(**_kwargs: object) -> None:
    """A worker started with --deployment loads its model now, once, before it takes any
    batch (its threads pool shares it); every other worker may never load one."""
    settings = get_settings()
    name = settings.worker_deployment
    serve_only([name] if name else [])
    if name:
        deployment = runtime().deployments.deployments.get(name)
        if deployment is None or deployment.provider != "local":
            raise ConfigError(f"QUOTAFLOW_WORKER_DEPLOYMENT={name!r} names no local deployment "
                              "of the deployments file")
        runner_for(deployment)
        # The engine ends as soon as the worker is told to stop: its closer thread reads
        # Celery's stop flag (no receiver of worker_shutting_down: workers/rounds.py).
        close_when_told(rounds.stopping)


@worker_shutdown.connect
def close_local_engines(**_kwargs: object) -> None:
    """Once the pool has stopped (its batches finished or handed back): shut this worker's
    engine down, vLLM's processes with it, so the worker can exit."""
    close_engines()


def warm() -> None:
    """Build this process's executor and open its database connection before the first
    batch comes: a cold process answered its first batch about 0.3 s later (imports,
    engine, connections), which a realtime job met in full on a worker just started (the
    realtime slot's companion, cli/worker_group.py, is often that worker). Failures are
    left to the first batch, which retries them."""
    try:
        with runtime().sessions() as session:
            session.execute(text("SELECT 1"))
        runtime().executor  # noqa: B018  (built now, not under the first batch)
    except Exception as exc:  # an outage now is the first batch's to meet and retry
        logging.getLogger(__name__).warning("warm-up skipped: %s", exc)


def warm_thread() -> None:
    """warm(), then this thread's event loop and its providers' clients (quotaflow/
    execution/loops.py keeps one of each per thread): what a batch on it would make."""
    warm()

    async def providers() -> None:
        for deployment in runtime().deployments.deployments.values():
            if deployment.provider != "local" and not deployment.is_batch:
                PROVIDERS.get(deployment)

    try:
        loops.run(providers())
    except Exception as exc:  # a provider that cannot be made fails its first batch
        logging.getLogger(__name__).warning("provider warm-up skipped: %s", exc)
        return
    logging.getLogger(__name__).info("warm: executor, database and providers ready")


@worker_ready.connect
def warm_threads(sender: object = None, **_kwargs: object) -> None:
    """A threads pool runs batches in its threads: warm one of them (the realtime
    companion has just one), on the pool's own executor. (Not prefork pool processes:
    Celery gives a new one 4 s to start, which a database slow to answer would exceed.)"""
    pool = getattr(sender, "pool", None)
    if isinstance(pool, ThreadsPool):
        pool.executor.submit(warm_thread)  # type: ignore[attr-defined]  # not in celery-types


# Postgres or Redis unreachable: the batch is tried again with backoff instead of
# failing (its items stay pending, or running under a lease the reaper reclaims).
@app.task(name=TASK_PROCESS_BATCH, bind=True, max_retries=None,
          autoretry_for=(ServiceUnavailable,), retry_backoff=2, retry_backoff_max=60,
          retry_jitter=True)
def process_batch(self: Task[Any, Any], job_id: str, first_line: int,
                  last_line: int) -> dict[str, int]:
    with translate_db_errors():
        report = runtime().executor.run(BatchRef(job_id, first_line, last_line))
    if report.retry_in is not None:
        # Items wait for budget, or are leased by another worker (look again when
        # its lease runs out, in case that worker died).
        raise self.retry(countdown=report.retry_in)
    return {"claimed": report.claimed, "succeeded": report.succeeded, "failed": report.failed}

"""A worker's Prometheus endpoint: the sum of all its pool processes' counters.

`quotaflow worker --metrics-port PORT` (cli/services.py) starts Celery with
QUOTAFLOW_WORKER_METRICS_PORT and a fresh PROMETHEUS_MULTIPROC_DIR of its own.
Every pool process writes its counters to its own files there
(quotaflow/metrics.py); the main process, which runs no batches, serves
/metrics on PORT from a registry that reads them all (prometheus_client's
multiprocess mode). A pool process that is replaced leaves its files behind, so
its counts stay in the sums; a worker that restarts starts from zero in a new
directory, which Prometheus reads as a counter reset, as it should. Without a
port nothing is served and the counters stay in each process's memory.
"""

import logging
import os
import shutil
from pathlib import Path

from celery.signals import worker_process_shutdown, worker_ready, worker_shutdown
from prometheus_client import CollectorRegistry, multiprocess, start_http_server

from quotaflow.config import get_settings

log = logging.getLogger(__name__)

# The directories cli/services.py makes; only those are removed at shutdown.
OWN_PREFIX = "quotaflow-metrics-"


def _directory() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR")


@worker_ready.connect
def serve_metrics(**_kwargs: object) -> None:
    """Serve /metrics from the main process once the pool has started (its processes then
    do not inherit the listening socket)."""
    port = get_settings().worker_metrics_port
    if port is None:
        return
    if not _directory():
        # Celery logs what a signal handler raises and carries on: say it plainly instead.
        log.error("no metrics served: QUOTAFLOW_WORKER_METRICS_PORT needs "
                  "PROMETHEUS_MULTIPROC_DIR, set before the worker starts; start workers "
                  "with `quotaflow worker --metrics-port PORT`, which sets both")
        return
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    try:
        start_http_server(port, registry=registry)
    except OSError as exc:
        log.error("no metrics served: port %d: %s", port, exc)
        return
    log.info("metrics at http://0.0.0.0:%d/metrics (files in %s)", port, _directory())


@worker_process_shutdown.connect
def forget_process(**_kwargs: object) -> None:
    """A pool process ends: drop its live gauges (its counters stay in the sums)."""
    if _directory():
        multiprocess.mark_process_dead(os.getpid())


@worker_shutdown.connect
def remove_files(**_kwargs: object) -> None:
    """The worker stops: its metrics directory goes (a new worker starts a new one)."""
    directory = _directory()
    # Only the worker that serves the directory removes it: a realtime companion
    # (cli/worker_group.py) writes into its main worker's and serves nothing.
    if get_settings().worker_metrics_port is None:
        return
    if directory and Path(directory).name.startswith(OWN_PREFIX):
        shutil.rmtree(directory, ignore_errors=True)

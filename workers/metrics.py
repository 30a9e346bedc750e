"""A worker's Prometheus endpoint: the sum of all its pool processes' counters.

`quotaflow worker --metrics-port PORT` (cli/services.py) starts Celery with
QUOTAFLOW_WORKER_METRICS_PORT and a fresh PROMETHEUS_MULTIPROC_DIR of its own.
Every pool process writes its counters to its own files there
(quotaflow/observe/metrics.py); the main process, which runs no batches, serves
/metrics on PORT from a registry that reads them all (prometheus_client's
multiprocess mode). A pool process that is replaced leaves its files behind, so
its counts stay in the sums; a worker that restarts starts from zero in a new
directory, which Prometheus reads as a counter reset, as it should. Without a
port nothing is served and the counters stay in each process's memory.
"""

import logging
import os
import shutil
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from celery.signals import worker_process_shutdown, worker_ready, worker_shutdown
from prometheus_client import CollectorRegistry, make_wsgi_app, multiprocess
from prometheus_client.exposition import ThreadingWSGIServer
from pydantic import SecretStr

from quotaflow.config import get_settings
from quotaflow.observe.metrics_auth import CHALLENGE, authorized

log = logging.getLogger(__name__)

# The directories cli/services.py makes; only those are removed at shutdown.
OWN_PREFIX = "quotaflow-metrics-"


def _directory() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR")


def collected() -> bool:
    """Whether this worker's counts are read: its processes write them to a directory
    that a metrics port serves (its own, or its main worker's for a realtime companion).
    Without one, the batch runs count nothing (a tally per request that no scrape
    would ever see)."""
    return bool(_directory())


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
        serve(port, registry, get_settings().metrics_token)
    except OSError as exc:
        log.error("no metrics served: port %d: %s", port, exc)
        return
    log.info("metrics at http://0.0.0.0:%d/metrics (files in %s)", port, _directory())


class _QuietHandler(WSGIRequestHandler):
    """No access line per scrape on the worker's stderr."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


def guarded(app: Callable[..., Iterable[bytes]], token: SecretStr | None
            ) -> Callable[..., Iterable[bytes]]:
    """The metrics app behind QUOTAFLOW_METRICS_TOKEN (quotaflow/observe/metrics_auth.py)."""

    def guarded_app(environ: dict[str, Any], start_response: Callable[..., Any]
                    ) -> Iterable[bytes]:
        if authorized(environ.get("HTTP_AUTHORIZATION"), token):
            return app(environ, start_response)
        start_response("401 Unauthorized", [("Content-Type", "text/plain"),
                                            ("WWW-Authenticate", CHALLENGE)])
        return [b"metrics need Authorization: Bearer <QUOTAFLOW_METRICS_TOKEN>\n"]

    return guarded_app


def serve(port: int, registry: CollectorRegistry, token: SecretStr | None) -> None:
    """prometheus_client's threaded server, with the token check in front of its app."""
    server = make_server("0.0.0.0", port, guarded(make_wsgi_app(registry), token),
                         ThreadingWSGIServer, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="quotaflow-metrics",
                     daemon=True).start()


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

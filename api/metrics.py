"""GET /metrics: the cluster's state in Prometheus's text format, read when scraped.

Open, like most exporters: Prometheus scrapes without credentials. It shows
deployment names, their limits and bucket levels, circuit states, queue depths
and counts of jobs and requests by status; never a tenant, a key, a prompt or an
answer. The workers' own counters (admissions, provider answers) are served by
each worker (`quotaflow worker --metrics-port`), not here.
"""

from functools import lru_cache

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from api.deps import runtime
from quotaflow.observe.gauges import StateCollector

router = APIRouter(tags=["metrics"])


@lru_cache
def registry() -> CollectorRegistry:
    """The API's own registry: only the scrape-time state (no process-default collectors,
    no worker counters, which are zero in this process)."""
    own = CollectorRegistry(auto_describe=False)
    own.register(StateCollector(runtime()))
    return own


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE_LATEST: {}},
                             "description": "Prometheus text exposition format"}})
def metrics() -> Response:
    """Budgets, circuits, queues, jobs and requests by status, read now."""
    return Response(generate_latest(registry()), media_type=CONTENT_TYPE_LATEST)

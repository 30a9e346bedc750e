"""quotaflow's REST API: the app and its routers.

`api.jobs` holds quotaflow's own job routes (`api.job_status`: a job's status read, its
long-poll and its event stream), `api.limits` the deployments' budgets
(operator keys), `api.webhooks` the tenant's webhook endpoints and deliveries, `api.v1`
OpenAI's Files and Batch APIs, `api.messages_batches` Anthropic's Message Batches API,
`api.metrics` Prometheus's /metrics (open), `api.audit` the audit log (admin keys),
`api.console` the jobs console in the browser (/console). The OpenAPI docs are at /docs
and list every status a route answers (api.openapi); errors become answers in one place
(api.errors); every answer carries an x-request-id (api.request_id).
"""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio.to_thread
from fastapi import FastAPI
from sqlalchemy import text

from api import (
    audit,
    console,
    deps,
    errors,
    job_status,
    jobs,
    limits,
    messages_batches,
    metrics,
    openapi,
    v1,
    webhooks,
)
from api.admission import AdmissionMiddleware
from api.deps import SessionDep
from api.errors import responses
from api.job_reads import LOADS_AT_ONCE
from api.rate_limit import RateLimitMiddleware
from api.request_id import RequestIdMiddleware
from api.schemas.common import Health
from api.status_fast_path import StatusFastPath
from quotaflow import __version__, db
from quotaflow.config import Settings, get_settings

# Threads beyond the admitted requests' one each: the uncounted routes (probes, metrics,
# status reads' loads, long-polls' and event streams' reads) and sessions closing.
SPARE_THREADS = LOADS_AT_ONCE + 4
# Connections beyond one per admitted request: the status reads' loads, and a route that
# opens a second session.
SPARE_CONNECTIONS = LOADS_AT_ONCE + 4


def size_for_admission(settings: Settings) -> None:
    """One database connection per admitted request (api/admission.py), made before the
    first engine: a request that found a place never waits for a connection; one that
    still does (a route holding two) is answered 503 after the line's wait, never 30 s."""
    db.size_pool(settings.api_concurrency, SPARE_CONNECTIONS, settings.api_queue_timeout_s)


@asynccontextmanager
async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
    # AnyIO's pool runs the sync routes and dependencies; its limit is per event loop.
    limiter = anyio.to_thread.current_default_thread_limiter()
    limiter.total_tokens = get_settings().api_concurrency + SPARE_THREADS
    yield


def create_app() -> FastAPI:
    settings = get_settings()
    size_for_admission(settings)
    app = FastAPI(title="quotaflow", version=__version__, lifespan=lifespan,
                  description="Batch LLM jobs on one cluster-wide provider budget.")
    errors.install(app)
    openapi.install(app)
    # Outermost last: every answer carries an x-request-id; a key over its limit is told
    # so (429) before it takes one of the places that admission counts (503).
    # Innermost: status reads answered from memory skip routing and dependencies.
    app.add_middleware(StatusFastPath, reads=deps.job_reads, remembered=deps.remembered_grant)
    app.add_middleware(AdmissionMiddleware, concurrency=settings.api_concurrency,
                       queue_timeout_s=settings.api_queue_timeout_s)
    app.add_middleware(RateLimitMiddleware)  # per-key limits (api/rate_limit.py)
    app.add_middleware(RequestIdMiddleware)

    @app.get("/healthz", response_model=Health, responses=responses())
    def healthz(session: SessionDep) -> dict[str, str]:
        session.execute(text("SELECT 1"))
        return {"status": "ok"}

    app.include_router(jobs.router)
    app.include_router(job_status.router)
    app.include_router(limits.router)
    app.include_router(v1.router)
    app.include_router(messages_batches.router)
    app.include_router(webhooks.router)
    app.include_router(audit.router)
    app.include_router(metrics.router)
    console.install(app)  # the jobs console at /console, after errors.install
    return app


app = create_app()

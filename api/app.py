"""quotaflow's REST API: the app and its routers.

`api.jobs` holds quotaflow's own job routes (`api.job_status`: a job's status read, its
long-poll and its event stream), `api.limits` the deployments' budgets
(operator keys), `api.webhooks` the tenant's webhook endpoints and deliveries, `api.v1`
OpenAI's Files and Batch APIs, `api.messages_batches` Anthropic's Message Batches API,
`api.metrics` Prometheus's /metrics (open), `api.console` the jobs console in the
browser (/console). The OpenAPI
docs are at /docs and list every status a route answers (api.openapi); errors become
answers in one place (api.errors); every answer carries an x-request-id (api.request_id).
"""

from fastapi import FastAPI
from sqlalchemy import text

from api import (
    console,
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
from api.deps import SessionDep
from api.errors import responses
from api.request_id import RequestIdMiddleware
from quotaflow import __version__


def create_app() -> FastAPI:
    app = FastAPI(title="quotaflow", version=__version__,
                  description="Batch LLM jobs on one cluster-wide provider budget.")
    errors.install(app)
    openapi.install(app)
    app.add_middleware(RequestIdMiddleware)

    @app.get("/healthz", responses=responses())
    def healthz(session: SessionDep) -> dict[str, str]:
        session.execute(text("SELECT 1"))
        return {"status": "ok"}

    app.include_router(jobs.router)
    app.include_router(job_status.router)
    app.include_router(limits.router)
    app.include_router(v1.router)
    app.include_router(messages_batches.router)
    app.include_router(webhooks.router)
    app.include_router(metrics.router)
    console.install(app)  # the jobs console at /console, after errors.install
    return app


app = create_app()

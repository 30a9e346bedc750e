"""The console's pages: sign-in, the tenant's jobs, a job, its keys and caps, and the
operators' budgets.

Server-rendered with Jinja2; a few lines of the console's own script (static/console.js)
refresh the live parts from fragments these routes serve (a job's, when its event stream
says it changed). Every page acts for the
tenant of the key in the cookie (session.py): another tenant's job is "not found".
"""

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from fastapi.templating import Jinja2Templates

from api.console.session import (
    COOKIE,
    SignInRequired,
    Viewer,
    check_post,
    clear_cookie,
    identify,
    set_cookie,
    sign_in_value,
)
from api.deps import (
    AfterQuery,
    DeploymentsDep,
    DispatcherDep,
    IdPath,
    LimiterDep,
    SessionsDep,
    SettingsDep,
    job_reads,
)
from api.job_status import LastEventId, event_stream
from api.jobs import QueueFilter, StatusFilter
from quotaflow.budget.limiter import describe
from quotaflow.compat import retention
from quotaflow.constants import QUEUES
from quotaflow.deployments.pricing import money
from quotaflow.errors import ConfigError
from quotaflow.jobs import service as jobs
from quotaflow.jobs import view as job_view
from quotaflow.models import JobStatus, utcnow
from quotaflow.observe import bound_data, console_data, report_data
from quotaflow.results import output
from quotaflow.tenants import audit, overview
from quotaflow.tenants.grants import Scope

PAGE_SIZE = 20
templates = Jinja2Templates(directory=Path(__file__).parent / "templates")
router = APIRouter(prefix="/console", include_in_schema=False)


def viewer(request: Request, sessions: SessionsDep, settings: SettingsDep) -> Viewer:
    return identify(sessions, settings, request.cookies.get(COOKIE))


ViewerDep = Annotated[Viewer, Depends(viewer)]
CsrfForm = Annotated[str | None, Form(alias="csrf_token")]


def page(request: Request, name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    return templates.TemplateResponse(request, name, {"now": time.time(), **context},
                                      status_code=status_code)


@router.get("")
def home() -> RedirectResponse:
    return RedirectResponse("/console/jobs", status_code=303)


@router.get("/login")
def login_form(request: Request, settings: SettingsDep) -> HTMLResponse:
    return page(request, "login.html", auth=settings.auth, error=None)


@router.post("/login")
def login(request: Request, sessions: SessionsDep, settings: SettingsDep,
          api_key: Annotated[str, Form()] = "") -> Response:
    value = sign_in_value(settings, api_key.strip())
    try:
        identify(sessions, settings, value)
    except SignInRequired as exc:  # the form again, saying why
        return page(request, "login.html", status_code=401, auth=settings.auth,
                    error=str(exc))
    answer = RedirectResponse("/console/jobs", status_code=303)
    set_cookie(answer, request, value)
    return answer


@router.post("/logout")
def logout(request: Request, who: ViewerDep, csrf_token: CsrfForm = None) -> Response:
    check_post(request, who, csrf_token)
    answer = RedirectResponse("/console/login", status_code=303)
    clear_cookie(answer)
    return answer


@router.get("/jobs")
def job_list(request: Request, sessions: SessionsDep, who: ViewerDep,
             status: Annotated[StatusFilter | None, Query()] = None,
             queue: Annotated[QueueFilter | None, Query()] = None,
             after: AfterQuery = None, partial: bool = False) -> HTMLResponse:
    """The tenant's jobs, newest first, paged and filtered as GET /jobs pages them."""
    with sessions() as session:
        found = jobs.list_jobs(session, limit=PAGE_SIZE + 1, after=after, tenant=who.tenant,
                               status=status, queue=queue)
        job_view.prefetch(session, [job.id for job in found[:PAGE_SIZE]])
        rows = [_row(job_view.job_object(session, job)) for job in found[:PAGE_SIZE]]
    context: dict[str, Any] = {
        "who": who, "rows": rows, "has_more": len(found) > PAGE_SIZE,
        "status": status, "queue": queue, "after": after,
        "statuses": JobStatus.ACTIVE + JobStatus.FINAL, "queues": QUEUES,
        "active": any(not r["final"] for r in rows)}
    return page(request, "job_rows.html" if partial else "jobs.html", **context)


@router.get("/jobs/{job_id}")
def job_page(job_id: IdPath, request: Request, sessions: SessionsDep,
             who: ViewerDep) -> HTMLResponse:
    return page(request, "job.html", who=who,
                **_job_context(sessions, job_id, who))


@router.get("/jobs/{job_id}/live")
def job_live(job_id: IdPath, request: Request, sessions: SessionsDep,
             who: ViewerDep) -> HTMLResponse:
    """The job page's live part: status, progress, counts, its buttons."""
    return page(request, "job_live.html", who=who,
                **_job_context(sessions, job_id, who))


@router.get("/jobs/{job_id}/events")
async def job_events(job_id: IdPath, request: Request, who: ViewerDep,
                     last_event_id: LastEventId = None) -> Response:
    """GET /jobs/{id}/events for the signed-in tenant (an EventSource sends the cookie,
    not a key): the page's script reloads its live part when an event says the job
    changed, instead of on a timer."""
    return await event_stream(request, job_id, who.tenant, last_event_id)


@router.get("/jobs/{job_id}/bound")
def job_bound(job_id: IdPath, request: Request, sessions: SessionsDep, who: ViewerDep,
              deployments: DeploymentsDep, settings: SettingsDep) -> HTMLResponse:
    """What bound the job: its own fragment, refreshed less often than the progress (it
    aggregates every result of the job)."""
    with sessions() as session:
        final = jobs.get_job(session, job_id, who.tenant).status in JobStatus.FINAL
        try:
            bound = bound_data.job_bound(session, job_id, deployments, settings, who.tenant)
        except ConfigError:  # not PostgreSQL: the section says so instead
            bound = None
    return page(request, "job_bound.html", bound=bound, final=final)


@router.get("/jobs/{job_id}/plots")
def job_plots(job_id: IdPath, request: Request, sessions: SessionsDep, who: ViewerDep,
              deployments: DeploymentsDep) -> HTMLResponse:
    """The report's plots, loaded after the page (matplotlib takes a moment)."""
    from quotaflow.observe import report  # matplotlib loads on the first plots, not at start

    with sessions() as session:
        data = report_data.report_data(session, job_id, report_data.budgets(deployments),
                                       who.tenant)
    return page(request, "plots.html", plots=report.plots(data))


@router.get("/jobs/{job_id}/download/{which}")
def download(job_id: IdPath, which: str, sessions: SessionsDep, who: ViewerDep) -> Response:
    """The output or error lines as a file, named after the job."""
    if which not in ("output", "errors"):
        return Response("no such download", status_code=404, media_type="text/plain")
    with sessions() as session:
        retention.require_results(jobs.get_job(session, job_id, who.tenant))

    def chunks() -> Iterator[bytes]:
        with sessions() as session:
            yield from output.output_chunks(
                output.iter_output(session, job_id, errors=which == "errors"))

    name = f"{job_id}{'.errors' if which == 'errors' else ''}.jsonl"
    return StreamingResponse(chunks(), media_type="application/jsonl",
                             headers={"Content-Disposition": f'attachment; filename="{name}"'})


@router.post("/jobs/{job_id}/cancel")
def cancel(job_id: IdPath, request: Request, sessions: SessionsDep, who: ViewerDep,
           csrf_token: CsrfForm = None) -> Response:
    check_post(request, who, csrf_token)
    who.require(Scope.SUBMIT, "cancelling a job")
    with sessions() as session:
        jobs.get_job(session, job_id, who.tenant)
    jobs.cancel_job(sessions, job_id, _actor(request, who))
    job_reads().forget(job_id)
    return RedirectResponse(f"/console/jobs/{job_id}", status_code=303)


@router.post("/jobs/{job_id}/retry")
def retry(job_id: IdPath, request: Request, sessions: SessionsDep, who: ViewerDep,
          settings: SettingsDep, dispatcher: DispatcherDep,
          csrf_token: CsrfForm = None) -> Response:
    check_post(request, who, csrf_token)
    who.require(Scope.SUBMIT, "retrying a job's failed lines")
    with sessions() as session:
        jobs.get_job(session, job_id, who.tenant)
    jobs.retry_failed(sessions, job_id, dispatcher, settings, _actor(request, who))
    job_reads().forget(job_id)
    return RedirectResponse(f"/console/jobs/{job_id}", status_code=303)


@router.get("/limits")
def limits(request: Request, who: ViewerDep, deployments: DeploymentsDep,
           limiter: LimiterDep, settings: SettingsDep) -> HTMLResponse:
    """Every deployment's budget, as `quotaflow limits` shows it: operators only."""
    if not who.operator:
        return page(request, "error.html", status_code=403, who=who, title="Operators only",
                    message="The budgets are every tenant's usage: sign in with an operator "
                            "key (`quotaflow keys create --tenant NAME --operator`).")
    rows = [describe(d, limiter) for d in deployments.deployments.values()]
    return page(request, "limits.html", who=who, rows=rows, flower=settings.flower_url,
                grafana=settings.grafana_url)


@router.get("/keys")
def keys_page(request: Request, who: ViewerDep, sessions: SessionsDep,
              deployments: DeploymentsDep, limiter: LimiterDep) -> HTMLResponse:
    """The tenant's keys (masked), scopes, expiry, allowlists, caps and usage against
    them; an operator sees every tenant."""
    with sessions() as session:
        found = overview.tenants(session, None if who.operator else who.tenant, utcnow())
    listed = list(deployments.deployments.values())
    views = [overview.with_usage(view, listed, limiter) for view in found]
    return page(request, "keys.html", who=who, tenants=views)


def _actor(request: Request, who: Viewer) -> audit.Actor:
    return audit.Actor(who.tenant, None if who.key_id == "none" else who.key_id,
                       request.client.host if request.client else None)


def _job_context(sessions: Any, job_id: str, who: Viewer) -> dict[str, Any]:
    with sessions() as session:
        job = job_view.job_object(session, jobs.get_job(session, job_id, who.tenant))
        errors = [] if job["deleted"] else console_data.first_errors(session, job_id)
    return {"job": _row(job), "errors": errors}


def _row(job: dict[str, Any]) -> dict[str, Any]:
    """The job object with what the pages print: progress, ETA, age, cost as text."""
    shown = console_data.progress(job, time.time())
    return {**job, "progress": shown, "final": job["status"] in JobStatus.FINAL,
            "eta": console_data.duration_text(shown.eta_s),
            "age": console_data.duration_text(shown.age_s), "cost_text": _cost(job["cost"]),
            "cancellable": job["status"] in JobStatus.ACTIVE
                           and job["status"] != JobStatus.CANCELLING,
            "retryable": job["status"] in (JobStatus.IN_PROGRESS, JobStatus.COMPLETED)
                         and job["request_counts"]["failed"] > 0 and not job["deleted"]}


def _cost(cost: dict[str, Any] | None) -> str:
    if not cost or not cost.get("by_deployment"):
        return "-"
    if cost.get("currency") is None:
        return "unknown (no prices)"
    return money(cost["total"], cost["currency"]) + ("" if cost.get("complete") else " +?")


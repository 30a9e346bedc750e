"""quotaflow's own job routes: create a job from a JSONL upload, follow it, download results.

Routes only translate HTTP to quotaflow.ingest.pipeline and quotaflow.jobs.service calls,
and act for the tenant of the request's API key (api.deps.tenant): another tenant's job is
"not found". The OpenAI-compatible routes under /v1 are api.v1.
"""

import json
from typing import IO, TYPE_CHECKING, Annotated, Any, Literal, cast

from fastapi import APIRouter, File, Form, Query, Request, Response, UploadFile
from fastapi.responses import HTMLResponse, StreamingResponse
from sqlalchemy.orm import Session, sessionmaker
from starlette.requests import ClientDisconnect

from api.body_stream import BodyReader, read_while_receiving
from api.deps import (
    JSON_OBJECT_OF_STRINGS,
    ActorDep,
    AfterQuery,
    DeploymentsDep,
    DispatcherDep,
    GrantDep,
    IdempotencyKey,
    IdPath,
    SessionDep,
    SessionsDep,
    SettingsDep,
    TenantDep,
    job_reads,
)
from api.errors import responses
from api.schemas.jobs import Estimate, Job, JobBound, JobList, RetriedJob
from api.v1 import FORM_OVERHEAD_BYTES
from quotaflow.budget.caps import MAX_CAP
from quotaflow.compat import retention
from quotaflow.config import get_settings
from quotaflow.constants import DEFAULT_QUEUE, QUEUES
from quotaflow.errors import InvalidParameter
from quotaflow.ingest import estimate
from quotaflow.ingest import pipeline as ingest
from quotaflow.jobs import service as jobs
from quotaflow.jobs import view as job_view
from quotaflow.models import JobStatus
from quotaflow.observe import bound_data, report_data
from quotaflow.results import output_pieces

JSONL = "application/jsonl"
REPLAYED_HEADER = "Idempotent-Replayed"

router = APIRouter(tags=["jobs"])
# The list's filters: a job's statuses and queues (Literal of the tuples' values).
if TYPE_CHECKING:  # Literals made of the tuples at run time; strs to the checker
    StatusFilter = str
    QueueFilter = str
else:
    StatusFilter = Literal[JobStatus.ACTIVE + JobStatus.FINAL]
    QueueFilter = Literal[QUEUES]
# The create routes' rules, stated in the schema; the routes check them as before (their
# errors name the parameter and the reason).
QUEUE_RULE: dict[str, Any] = {"enum": list(QUEUES)}
METADATA_DOC = "JSON object of strings"
# A body the client sends as it is: a JSONL file, however it labels it.
JSONL_BODY = {"schema": {"type": "string", "format": "binary",
                         "contentMediaType": "application/octet-stream"}}


@router.post("/jobs", status_code=201, response_model=Job | Estimate,
          max_body_size=get_settings().max_file_bytes + FORM_OVERHEAD_BYTES,
          responses={200: {"model": Job | Estimate,
                           "description": "The job made earlier with this Idempotency-Key "
                                          "(header `Idempotent-Replayed: true`), or with "
                                          "`dry_run=true` the file's estimate (nothing stored)"},
                     **responses(400, 401, 413)})
def create_job(
    file: Annotated[UploadFile, File(description="JSONL input, OpenAI batch format")],
    sessions: SessionsDep, settings: SettingsDep, deployments: DeploymentsDep,
    dispatcher: DispatcherDep, grant: GrantDep, actor: ActorDep, response: Response,
    queue: Annotated[str, Form(json_schema_extra=QUEUE_RULE)] = DEFAULT_QUEUE,
    metadata: Annotated[str | None, Form(description=METADATA_DOC,
                                         json_schema_extra=JSON_OBJECT_OF_STRINGS)] = None,
    max_attempts: Annotated[int | None, Form(
        ge=1, le=jobs.MAX_ATTEMPTS_LIMIT,
        description="Tries per request at the provider (default: "
                    "QUOTAFLOW_PROVIDER_MAX_ATTEMPTS)")] = None,
    max_rpm: Annotated[int | None, Form(
        ge=1, le=MAX_CAP, description="Cap the job's requests per minute inside each "
        "deployment's budget (beside its tenant's cap)")] = None,
    max_tpm: Annotated[int | None, Form(
        ge=1, le=MAX_CAP, description="Cap the job's tokens per minute inside each "
        "deployment's budget (prompt estimate + max_tokens, as the budget counts them)")] = None,
    idempotency_key: IdempotencyKey = None,
    output_format: Annotated[Literal["openai", "anthropic"] | None, Form(
        description="Output lines: OpenAI batch output lines, or Anthropic Message Batches "
                    "results (default: the format of the file's lines)")] = None,
    dedup: Annotated[bool | None, Form(
        description="Share one answer between identical lines: true every identical line, "
                    "false none; unset, only lines whose answer cannot differ (temperature "
                    "0 without n or top_p sampling, embeddings, moderations)")] = None,
    dry_run: Annotated[bool, Query(
        description="Store nothing: answer 200 with the file's estimate (tokens, cost, "
                    "time at the deployments' budgets, the tenant's limits)")] = False,
) -> dict[str, Any]:
    """Make a job of the uploaded file (201), or return the tenant's job made earlier
    with the same Idempotency-Key (200, `Idempotent-Replayed: true`). With
    `dry_run=true`, estimate the file instead and store nothing (200)."""
    if dry_run:
        _metadata(metadata)  # refused as submit would refuse it
        response.status_code = 200
        found = estimate.scan_file(file.file, settings, deployments, queue)
        with sessions() as session:
            return estimate.estimate_object(found, session, settings, grant.tenant)
    # Starlette has spooled the upload to a temporary file; ingest reads it once.
    spec = ingest.JobSpec(queue=queue, tenant=grant.tenant, filename=_filename(file.filename),
                          metadata=_metadata(metadata), max_attempts=max_attempts,
                          idempotency_key=idempotency_key, output_format=output_format,
                          dedup=dedup, allow=grant.allow, actor=actor, max_rpm=max_rpm,
                          max_tpm=max_tpm)
    made = ingest.create_job(sessions, file.file, settings=settings,
                             deployments=deployments, dispatcher=dispatcher, spec=spec)
    return _created(sessions, made, response)

@router.post("/jobs/jsonl", status_code=201, response_model=Job,
             max_body_size=get_settings().max_file_bytes,
             openapi_extra={"requestBody": {"required": True, "content": {
                 JSONL: JSONL_BODY, "application/octet-stream": JSONL_BODY}}},
             responses={200: {"model": Job,
                              "description": "The job made earlier with this Idempotency-Key "
                                             "(header `Idempotent-Replayed: true`)"},
                        **responses(400, 401, 413)})
async def create_job_from_body(
    request: Request, sessions: SessionsDep, settings: SettingsDep,
    deployments: DeploymentsDep, dispatcher: DispatcherDep, grant: GrantDep,
    actor: ActorDep, response: Response,
    queue: Annotated[str, Query(json_schema_extra=QUEUE_RULE)] = DEFAULT_QUEUE,
    metadata: Annotated[str | None, Query(description=METADATA_DOC,
                                          json_schema_extra=JSON_OBJECT_OF_STRINGS)] = None,
    max_attempts: Annotated[int | None, Query(ge=1, le=jobs.MAX_ATTEMPTS_LIMIT)] = None,
    max_rpm: Annotated[int | None, Query(ge=1, le=MAX_CAP)] = None,
    max_tpm: Annotated[int | None, Query(ge=1, le=MAX_CAP)] = None,
    idempotency_key: IdempotencyKey = None,
    output_format: Annotated[Literal["openai", "anthropic"] | None, Query()] = None,
    dedup: Annotated[bool | None, Query()] = None,
    filename: Annotated[str | None, Query(max_length=255)] = None,
) -> dict[str, Any]:
    """Make a job of the request's body, a JSONL file (`Content-Type: application/jsonl`,
    or any other: the body is read as it is),
    with POST /jobs's options in the query string. The lines are read and stored as the
    body arrives, rather than after the whole upload as a form is (api/body_stream.py);
    the answers are POST /jobs's."""
    spec = ingest.JobSpec(queue=queue, tenant=grant.tenant, filename=_filename(filename),
                          metadata=_metadata(metadata), max_attempts=max_attempts,
                          idempotency_key=idempotency_key, output_format=output_format,
                          dedup=dedup, allow=grant.allow, actor=actor, max_rpm=max_rpm,
                          max_tpm=max_tpm)

    def make(body: BodyReader) -> dict[str, Any]:
        # The part of a binary file that ingest uses: read, and seekable (False).
        stream = cast(IO[bytes], body)
        made = ingest.create_job(sessions, stream, settings=settings, deployments=deployments,
                                 dispatcher=dispatcher, spec=spec, reopen=body.reread)
        return _created(sessions, made, response)

    try:
        return await read_while_receiving(request.stream(), make)
    except ClientDisconnect as exc:  # nobody is left to answer; nothing was stored
        raise InvalidParameter("body", str(exc)) from None


def _created(sessions: sessionmaker[Session], made: ingest.Created,
             response: Response) -> dict[str, Any]:
    """A new job's object (201), or the one an Idempotency-Key made before (200)."""
    if made.replayed:
        response.status_code = 200
        response.headers[REPLAYED_HEADER] = "true"
    with sessions() as session:  # a new job is as ingest left it: no need to read it again
        job = jobs.get_job(session, made.job.id) if made.replayed else made.job
        return job_view.job_object(session, job, made.counts)


@router.get("/jobs", response_model=JobList, responses=responses(401, 404))
def list_jobs(session: SessionDep, tenant: TenantDep,
              limit: Annotated[int, Query(ge=1, le=100)] = 20,
              after: AfterQuery = None,
              status: Annotated[StatusFilter | None, Query(
                  description="Only jobs in this status")] = None,
              queue: Annotated[QueueFilter | None, Query(
                  description="Only jobs of this queue")] = None) -> dict[str, Any]:
    """The tenant's jobs, newest first, paged by `after` (the last id of a page)."""
    page = jobs.list_jobs(session, limit=limit + 1, after=after, tenant=tenant,
                          status=status, queue=queue)
    job_view.prefetch(session, [job.id for job in page[:limit]])
    data = [job_view.job_object(session, job) for job in page[:limit]]
    return {"object": "list", "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": len(page) > limit}

@router.post("/jobs/{job_id}/cancel", response_model=Job, responses=responses(401, 404, 409))
def cancel_job(job_id: IdPath, sessions: SessionsDep, tenant: TenantDep,
               actor: ActorDep) -> dict[str, Any]:
    _own(sessions, job_id, tenant)
    jobs.cancel_job(sessions, job_id, actor)
    job_reads().forget(job_id)
    with sessions() as session:
        return job_view.job_object(session, jobs.get_job(session, job_id))

@router.post("/jobs/{job_id}/retry", response_model=RetriedJob,
             responses=responses(401, 404, 409))
def retry_job(job_id: IdPath, sessions: SessionsDep, settings: SettingsDep,
              dispatcher: DispatcherDep, tenant: TenantDep, actor: ActorDep) -> dict[str, Any]:
    """Queue a job's failed requests again (not its invalid lines)."""
    _own(sessions, job_id, tenant)
    retried = jobs.retry_failed(sessions, job_id, dispatcher, settings, actor)
    job_reads().forget(job_id)
    with sessions() as session:
        return {**job_view.job_object(session, jobs.get_job(session, job_id)),
                "retried": retried}

@router.delete("/jobs/{job_id}", response_model=Job, responses=responses(401, 404, 409))
def delete_job(job_id: IdPath, sessions: SessionsDep, tenant: TenantDep,
               actor: ActorDep) -> dict[str, Any]:
    """Delete a finished job's results and its lines' bodies; the job is kept as a
    tombstone (`deleted: true`, its counts and usage as they were). A job still running
    is a 409: cancel it first."""
    job = retention.delete_job(sessions, job_id, tenant, actor)
    job_reads().forget(job_id)
    with sessions() as session:
        return job_view.job_object(session, job)

@router.get("/jobs/{job_id}/results", response_class=StreamingResponse,
         responses=responses(401, 404))
def results(job_id: IdPath, sessions: SessionsDep, tenant: TenantDep) -> StreamingResponse:
    _own(sessions, job_id, tenant)
    return _stream(sessions, job_id, errors=False)

@router.get("/jobs/{job_id}/errors", response_class=StreamingResponse,
         responses=responses(401, 404))
def error_lines(job_id: IdPath, sessions: SessionsDep, tenant: TenantDep) -> StreamingResponse:
    _own(sessions, job_id, tenant)
    return _stream(sessions, job_id, errors=True)


@router.get("/jobs/{job_id}/report", response_class=Response,
            responses={200: {"description": "One self-contained HTML page",
                             "content": {"text/html": {"schema": {"type": "string"}}}},
                       **responses(401, 404)})
def job_report(job_id: IdPath, session: SessionDep, deployments: DeploymentsDep,
               settings: SettingsDep, tenant: TenantDep) -> HTMLResponse:
    """The job's report: one self-contained HTML page (plots as inline SVG) of its
    admissions against each deployment's budget, what bound it, outcomes, latency, errors
    and usage."""
    from quotaflow.observe import report  # matplotlib loads on the first report, not at start

    retention.require_results(jobs.get_job(session, job_id, tenant))  # 404 once deleted
    data = report_data.report_data(session, job_id, report_data.budgets(deployments), tenant)
    data.bound = bound_data.job_bound(session, job_id, deployments, settings, tenant)
    return HTMLResponse(report.render(data))


@router.get("/jobs/{job_id}/bound", response_model=JobBound, responses=responses(401, 404))
def job_bound(job_id: IdPath, session: SessionDep, deployments: DeploymentsDep,
              settings: SettingsDep, tenant: TenantDep) -> dict[str, Any]:
    """What bound the job: seconds of its time per cause (a deployment's budget and
    which limit, calls in flight at max_concurrency, waiting for workers, 429 pauses),
    the top cause and what would make it faster (quotaflow/observe/bound.py)."""
    found = bound_data.job_bound(session, job_id, deployments, settings, tenant)
    return {"object": "job.bound", "id": job_id, **found.as_json(), "summary": found.summary()}


def _own(sessions: sessionmaker[Session], job_id: str, tenant: str) -> None:
    """404 for a job of another tenant, before anything is done to it."""
    with sessions() as session:
        jobs.get_job(session, job_id, tenant)


def _filename(name: str | None) -> str | None:
    return None if name is None else name.replace("\x00", "")[:255]


def _metadata(raw: str | None) -> dict[str, str] | None:
    """The `metadata` form field: a flat JSON object of strings PostgreSQL can store."""
    if raw is None or not raw.strip():
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidParameter("metadata", f"metadata must be a JSON object: {exc.msg}") from exc
    except (ValueError, RecursionError) as exc:  # 4,300+ digits; nested past recursion
        raise InvalidParameter("metadata", "metadata must be a JSON object of string "
                                           "values") from exc
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise InvalidParameter("metadata", "metadata must be a JSON object of string values")
    if not all(_storable(key) and _storable(text) for key, text in value.items()):
        raise InvalidParameter("metadata", "metadata must not contain NUL characters or lone "
                                           "surrogates (\\ud800-\\udfff)")
    return value


def _storable(text: str) -> bool:
    """Whether PostgreSQL can hold the string: no NUL, and valid UTF-8 (no lone surrogate)."""
    if "\x00" in text:
        return False
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _stream(sessions: sessionmaker[Session], job_id: str, errors: bool) -> StreamingResponse:
    with sessions() as session:  # 404 before the stream starts
        retention.require_results(jobs.get_job(session, job_id))

    return StreamingResponse(output_pieces.output_stream(sessions, job_id, errors),
                             media_type=JSONL)

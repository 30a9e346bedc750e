"""OpenAI's Files and Batch APIs under /v1, so the official SDK runs against quotaflow.

Shapes and status codes follow OpenAI's API reference, errors included (api/errors.py:
a bad parameter is a 400 naming it, never FastAPI's 422); the logic lives in
quotaflow.compat.files and quotaflow.compat.openai_batches. One extension: the queue a batch runs
on, from the X-Quotaflow-Queue header or metadata["quotaflow_queue"].
"""

from collections.abc import Iterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, File, Form, Header, Query, UploadFile
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, Field, WithJsonSchema
from sqlalchemy.orm import Session, sessionmaker

from api.deps import (
    ID_PATTERN,
    ActorDep,
    AfterQuery,
    DeploymentsDep,
    DispatcherDep,
    GrantDep,
    IdempotencyKey,
    IdPath,
    SessionsDep,
    SettingsDep,
    TenantDep,
    job_reads,
)
from api.errors import responses
from api.etags import NOT_MODIFIED, IfNoneMatch
from api.job_reads import tagged
from api.openapi import FORM_RULES
from api.schemas.batches import Batch, BatchList
from api.schemas.files import FileDeleted, FileList, FileObject
from quotaflow.budget.caps import MAX_CAP
from quotaflow.compat import files, retention
from quotaflow.compat import openai_batches as batches
from quotaflow.config import get_settings
from quotaflow.constants import ENDPOINTS, QUEUES
from quotaflow.jobs import service as jobs
from quotaflow.jobs import view as job_view

router = APIRouter(prefix="/v1", tags=["OpenAI-compatible"])
# PostgreSQL text and JSONB cannot hold NUL characters.
NO_NUL = r"^[^\x00]*$"
# Room for the multipart envelope around a file at the size limit.
FORM_OVERHEAD_BYTES = 64 * 1024
# The rules quotaflow.compat checks, stated in the schema (their errors stay the domain's,
# naming the parameter and the reason).
QUEUE_RULE: dict[str, Any] = {"enum": list(QUEUES)}
QUEUE_HEADER = {"enum": [*QUEUES, ""], "description": "quotaflow extension: realtime, "
                "standard or bulk (empty or left out: the default, or metadata's)"}
# 1 to 99999 hours, minutes or seconds (openai_batches.window_seconds).
WINDOW_PATTERN = (r"^(0{0,4}[1-9]|0{0,3}[1-9][0-9]|0{0,2}[1-9][0-9]{2}|0?[1-9][0-9]{3}"
                  r"|[1-9][0-9]{4})[hms]$")
EXPIRY_SECONDS = {"type": "integer", "minimum": retention.MIN_EXPIRY_S,
                  "maximum": retention.MAX_EXPIRY_S}
# expires_after's two form fields: both given or neither.
EXPIRES_PAIRED = {"dependentRequired": {"expires_after[anchor]": ["expires_after[seconds]"],
                                        "expires_after[seconds]": ["expires_after[anchor]"]}}
EXPIRES_AFTER = {"type": "object", "additionalProperties": False,
                 "required": ["anchor", "seconds"],
                 "properties": {"anchor": {"const": retention.ANCHOR},
                                "seconds": EXPIRY_SECONDS}}


class CreateBatch(BaseModel):
    """POST /v1/batches, as the OpenAI SDK sends it."""

    input_file_id: str = Field(pattern=ID_PATTERN)
    endpoint: str = Field(max_length=64, json_schema_extra={"enum": list(ENDPOINTS)})
    completion_window: str = Field(default="24h", max_length=16,
                                   json_schema_extra={"pattern": WINDOW_PATTERN})
    # OpenAI: at most 16 pairs, keys up to 64 and values up to 512 characters.
    metadata: dict[Annotated[str, Field(max_length=64, pattern=NO_NUL)],
                   Annotated[str, Field(max_length=512, pattern=NO_NUL)]] | None = Field(
        default=None, max_length=16, json_schema_extra={
            "properties": {batches.QUEUE_METADATA_KEY: {"type": "string", **QUEUE_RULE}},
            # a key with a NUL matches no pattern above: say it is refused, not open
            "patternProperties": {NO_NUL: {}}, "additionalProperties": False})
    # {"anchor": "created_at", "seconds": 3600..2592000}: checked by quotaflow.compat.retention,
    # whose errors name the part at fault (output_expires_after.seconds).
    output_expires_after: Annotated[dict[str, Any] | None, WithJsonSchema(
        {"anyOf": [EXPIRES_AFTER, {"type": "null"}]})] = None
    # quotaflow's extension (the OpenAI SDK sends it with extra_body): the batch's own caps
    # inside each deployment's budget, per minute; also metadata quotaflow_max_rpm / _tpm.
    max_rpm: int | None = Field(default=None, ge=1, le=MAX_CAP)
    max_tpm: int | None = Field(default=None, ge=1, le=MAX_CAP)


def _page(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {"object": "list", "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": has_more}


# --- files ---------------------------------------------------------------------------

@router.post("/files", response_model=FileObject,
             max_body_size=get_settings().max_upload_bytes + FORM_OVERHEAD_BYTES,
             responses=responses(400, 401, 413),
             openapi_extra={FORM_RULES: EXPIRES_PAIRED})
def upload_file(
    file: Annotated[UploadFile, File(description="JSONL of batch requests")],
    purpose: Annotated[str, Form(description='"batch"',
                                 json_schema_extra={"enum": [files.PURPOSE_BATCH]})],
    sessions: SessionsDep, settings: SettingsDep, tenant: TenantDep, actor: ActorDep,
    # As the OpenAI SDK sends `expires_after` in the multipart form.
    expires_anchor: Annotated[str | None, Form(
        alias="expires_after[anchor]", description='"created_at"',
        json_schema_extra={"enum": [retention.ANCHOR]})] = None,
    expires_seconds: Annotated[str | None, WithJsonSchema(EXPIRY_SECONDS), Form(
        alias="expires_after[seconds]", description="3600 to 2592000")] = None,
) -> dict[str, Any]:
    """Store an upload (streamed in chunks; refused whole over QUOTAFLOW_MAX_UPLOAD_BYTES).
    It expires `expires_after[seconds]` after its creation, else after
    QUOTAFLOW_FILE_RETENTION_S."""
    expires = (settings.file_retention_s or None
               if expires_anchor is None and expires_seconds is None
               else retention.expiry_seconds("expires_after", expires_anchor, expires_seconds))
    row = files.store_file(sessions, file.file, tenant=tenant, filename=file.filename or "",
                           purpose=purpose, max_bytes=settings.max_upload_bytes,
                           expires_after_s=expires, actor=actor)
    return files.file_object(row)


@router.get("/files", response_model=FileList, responses=responses(400, 401, 404))
def list_files(
    sessions: SessionsDep, tenant: TenantDep,
    purpose: Annotated[str | None, Query(max_length=32, pattern=NO_NUL)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    after: AfterQuery = None,
    order: Literal["asc", "desc"] = "desc",
) -> dict[str, Any]:
    """The tenant's uploads, newest first (batch output files are not listed)."""
    with sessions() as session:
        page = files.list_files(session, tenant, limit=limit + 1, after=after, purpose=purpose,
                                ascending=order == "asc")
        return _page([files.file_object(row) for row in page[:limit]], len(page) > limit)


@router.get("/files/{file_id}", response_model=FileObject, responses=responses(400, 401, 404))
def get_file(file_id: IdPath, sessions: SessionsDep, tenant: TenantDep) -> dict[str, Any]:
    with sessions() as session:
        virtual = files.virtual_file(session, file_id, tenant)
        if virtual is not None:
            return files.virtual_object(session, virtual)
        return files.file_object(files.get_file(session, file_id, tenant))


@router.get("/files/{file_id}/content", response_class=StreamingResponse,
            responses=responses(400, 401, 404))
def file_content(file_id: IdPath, sessions: SessionsDep, tenant: TenantDep) -> StreamingResponse:
    """The file's bytes; a batch's output or error file in input order (partial while it runs)."""
    with sessions() as session:  # 404 before the stream starts
        virtual = files.virtual_file(session, file_id, tenant)
        if virtual is None:
            files.get_file(session, file_id, tenant)
    if virtual is not None:
        return StreamingResponse(_lines(sessions, virtual), media_type="application/jsonl")
    return StreamingResponse(_chunks(sessions, file_id), media_type="application/octet-stream")


def _lines(sessions: sessionmaker[Session], virtual: files.VirtualFile) -> Iterator[bytes]:
    return files.virtual_stream(sessions, virtual)


def _chunks(sessions: sessionmaker[Session], file_id: str) -> Iterator[bytes]:
    with sessions() as session:
        yield from files.iter_chunks(session, file_id)


@router.delete("/files/{file_id}", response_model=FileDeleted,
               responses=responses(400, 401, 404, 409))
def delete_file(file_id: IdPath, sessions: SessionsDep, tenant: TenantDep,
                actor: ActorDep) -> dict[str, Any]:
    """An upload and its bytes; a batch's output or error file: that batch's results (409
    while it runs: cancel it first)."""
    retention.delete_file(sessions, file_id, tenant, actor)
    job_reads().forget_all()  # an output file's job is deleted with it
    return {"id": file_id, "object": "file", "deleted": True}


# --- batches -------------------------------------------------------------------------

@router.post("/batches", response_model=Batch, responses=responses(400, 401, 404))
def create_batch(
    body: CreateBatch, sessions: SessionsDep, settings: SettingsDep,
    deployments: DeploymentsDep, dispatcher: DispatcherDep, grant: GrantDep, actor: ActorDep,
    x_quotaflow_queue: Annotated[str | None, Header(json_schema_extra=QUEUE_HEADER)] = None,
    idempotency_key: IdempotencyKey = None,
) -> dict[str, Any]:
    """Make a batch of an uploaded file; the same Idempotency-Key again returns that batch."""
    request = batches.BatchRequest(
        input_file_id=body.input_file_id, endpoint=body.endpoint,
        completion_window=body.completion_window, metadata=body.metadata, tenant=grant.tenant,
        allow=grant.allow, actor=actor,
        queue=x_quotaflow_queue, idempotency_key=idempotency_key,
        max_rpm=body.max_rpm, max_tpm=body.max_tpm,
        output_expires_after_s=retention.expires_after("output_expires_after",
                                                       body.output_expires_after))
    job = batches.create_batch(sessions, request, settings=settings, deployments=deployments,
                               dispatcher=dispatcher)
    with sessions() as session:
        return batches.batch_object(session, jobs.get_job(session, job.id))


@router.get("/batches", response_model=BatchList, responses=responses(400, 401, 404))
def list_batches(
    sessions: SessionsDep, tenant: TenantDep,
    after: AfterQuery = None, limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> dict[str, Any]:
    with sessions() as session:
        page = jobs.list_jobs(session, limit=limit + 1, after=after, tenant=tenant)
        job_view.prefetch(session, [job.id for job in page[:limit]])
        return _page([batches.batch_object(session, job) for job in page[:limit]],
                     len(page) > limit)


@router.get("/batches/{batch_id}", response_model=Batch,
            responses={**NOT_MODIFIED, **responses(400, 401, 404)})
async def get_batch(batch_id: IdPath, sessions: SessionsDep, tenant: TenantDep,
                    if_none_match: IfNoneMatch = None) -> Response:
    """The batch, with its `ETag` (304 for a matching `If-None-Match`); read at most once
    per QUOTAFLOW_API_STATUS_CACHE_S by this process, whoever asks (api/job_reads.py)."""
    def load(session: Session) -> tuple[str, dict[str, Any]]:
        job = jobs.get_job(session, batch_id)
        return job.tenant, batches.batch_object(session, job)

    return tagged(await job_reads().read(("batch", batch_id), tenant, load), if_none_match)


@router.post("/batches/{batch_id}/cancel", response_model=Batch,
             responses=responses(400, 401, 404, 409))
def cancel_batch(batch_id: IdPath, sessions: SessionsDep, tenant: TenantDep,
                 actor: ActorDep) -> dict[str, Any]:
    """Stop new requests; those in flight finish and stay in the output file."""
    with sessions() as session:
        jobs.get_job(session, batch_id, tenant)
    jobs.cancel_job(sessions, batch_id, actor)
    job_reads().forget(batch_id)
    with sessions() as session:
        return batches.batch_object(session, jobs.get_job(session, batch_id))

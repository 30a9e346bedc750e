"""Anthropic's Message Batches API under /v1/messages/batches, so the official Anthropic
SDK's `client.messages.batches` runs against quotaflow unchanged.

Shapes, cursors and the rest of the logic are quotaflow.compat.anthropic_batches'; errors are
Anthropic's `{"type": "error", "error": {...}}` (api/anthropic_errors.py), never a 500
for a bad request nor FastAPI's 422. The key comes as `x-api-key` (Anthropic's header)
or `Authorization: Bearer` (api/deps.py); `anthropic-version` is accepted and ignored.
quotaflow's one extension, as under /v1/batches: the X-Quotaflow-Queue header.
"""

import contextlib
from collections.abc import Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import Response, StreamingResponse
from sqlalchemy.orm import Session, sessionmaker

from api.anthropic_errors import responses
from api.deps import (
    ID_PATTERN,
    ActorDep,
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
from api.etags import NOT_MODIFIED, IfNoneMatch, answer
from api.schemas.message_batches import DeletedMessageBatch, MessageBatch, MessageBatchList
from quotaflow.budget.caps import MAX_CAP
from quotaflow.compat import anthropic_batches as message_batches
from quotaflow.compat import retention
from quotaflow.compat.anthropic_batch_body import BatchTooLarge
from quotaflow.constants import QUEUES
from quotaflow.errors import InvalidRequest, JobStateError
from quotaflow.jobs import service as jobs
from quotaflow.models import Job
from quotaflow.results.output import output_chunks


async def anthropic_version(anthropic_version: Annotated[str | None, Header(
        max_length=64, description="Sent by Anthropic's SDK; accepted and ignored")] = None,
                            ) -> None:
    """Anthropic requires the header; quotaflow serves one version and needs none."""



# The anthropic-beta header's rule, as Anthropic writes it: names of letters, digits, '.',
# '_' and '-' (compat/anthropic_batches.beta_names), separated by a comma and a space at most.
BETAS_PATTERN = r"^[A-Za-z0-9._-]{1,100}(, ?[A-Za-z0-9._-]{1,100})*$"

router = APIRouter(prefix="/v1/messages/batches", tags=["Anthropic-compatible"],
                   dependencies=[Depends(anthropic_version)])

CursorQuery = Annotated[str | None, Query(
    pattern=ID_PATTERN, description="Give `before_id` or `after_id`, not both")]
# A content block or a list of them; a request's params as quotaflow.ingest.formats checks
# them (the rest of a Messages API body is passed on as written). A batch needs one
# request whose params pass (`contains`); the others are answered `errored`.
CONTENT = {"anyOf": [{"type": "string"}, {"type": "array", "items": {
    "type": "object", "required": ["type"], "properties": {"type": {"type": "string"}}}}]}
PARAMS = {"type": "object", "description": "A Messages API request body",
          "required": ["max_tokens", "messages"],
          "properties": {
              "model": {"type": "string"},
              "max_tokens": {"type": "integer", "minimum": 1},
              "messages": {"type": "array", "minItems": 1, "items": {
                  "type": "object", "required": ["role", "content"], "properties": {
                      "role": {"enum": ["user", "assistant"]}, "content": CONTENT}}},
              "system": {"anyOf": [*CONTENT["anyOf"], {"type": "null"}]}}}
# The schema of the create body, for the docs: the route reads the raw bytes itself
# (quotaflow/compat/anthropic_batch_body.py), so a 256 MB body is never Python objects at once.
CREATE_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "required": ["requests"], "additionalProperties": False,
    "properties": {"requests": {
        "type": "array", "minItems": 1, "contains": {"properties": {"params": PARAMS}},
        "items": {"type": "object", "required": ["custom_id", "params"],
                  "additionalProperties": False,
                  "properties": {"custom_id": {"type": "string",
                                               "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
                                 "params": {"type": "object"}}}}}}}}}}


async def raw_body(request: Request, settings: SettingsDep) -> bytes:
    """The body as sent, refused (Anthropic's 413 request_too_large) past
    QUOTAFLOW_MAX_MESSAGE_BATCH_BYTES: by its Content-Length before it is read, else as
    soon as it has grown past the limit."""
    limit = settings.max_message_batch_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BatchTooLarge(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BatchTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _base_url(request: Request) -> str:
    return str(request.base_url)


def _object(session: Session, job: Job, request: Request) -> dict[str, Any]:
    counts = message_batches.item_counts(session, [job.id])[job.id]
    return message_batches.batch_object(job, counts, _base_url(request))


def _found(sessions: sessionmaker[Session], batch_id: str, tenant: str) -> Job:
    with sessions() as session:
        return message_batches.get_batch(session, batch_id, tenant)


@router.post("", response_model=MessageBatch, openapi_extra=CREATE_BODY,
             responses=responses(400, 401, 413))
def create_message_batch(
    # The key is checked before the body is read.
    grant: GrantDep, actor: ActorDep, request: Request,
    body: Annotated[bytes, Depends(raw_body)],
    sessions: SessionsDep, settings: SettingsDep, deployments: DeploymentsDep,
    dispatcher: DispatcherDep, idempotency_key: IdempotencyKey = None,
    x_quotaflow_queue: Annotated[str | None, Header(
        description="quotaflow extension: realtime, standard (default; also when empty) "
                    "or bulk", json_schema_extra={"enum": [*QUEUES, ""]})] = None,
    anthropic_beta: Annotated[str | None, Header(
        max_length=2000, pattern=BETAS_PATTERN,
        description="Betas for every request that names none in its params "
        "(`params.betas`), comma-separated; forwarded to anthropic deployments")] = None,
    x_quotaflow_max_rpm: Annotated[int | None, Header(
        ge=1, le=MAX_CAP, description="quotaflow extension: cap the batch's requests per "
        "minute inside each deployment's budget")] = None,
    x_quotaflow_max_tpm: Annotated[int | None, Header(
        ge=1, le=MAX_CAP, description="quotaflow extension: cap its tokens per minute "
        "(input estimate + max_tokens)")] = None,
) -> dict[str, Any]:
    """Store the requests as a job and queue them, or refuse the batch whole (400)."""
    created = message_batches.create_batch(
        sessions, body, tenant=grant.tenant, settings=settings, deployments=deployments,
        dispatcher=dispatcher, queue=x_quotaflow_queue, idempotency_key=idempotency_key,
        anthropic_beta=anthropic_beta, allow=grant.allow, actor=actor,
        caps=(x_quotaflow_max_rpm, x_quotaflow_max_tpm))
    if created.counts is not None:  # a new job: its counts are known
        return message_batches.batch_object(created.job, created.counts, _base_url(request))
    with sessions() as session:
        return _object(session, created.job, request)


@router.get("", response_model=MessageBatchList, responses=responses(400, 401))
def list_message_batches(
    request: Request, sessions: SessionsDep, tenant: TenantDep,
    before_id: CursorQuery = None, after_id: CursorQuery = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
) -> dict[str, Any]:
    """The tenant's Message Batches, newest first."""
    with sessions() as session:
        page, more = message_batches.list_batches(session, tenant, limit=limit,
                                                  before_id=before_id, after_id=after_id)
        return message_batches.page_object(session, page, more, _base_url(request))


@router.get("/{message_batch_id}", response_model=MessageBatch,
            responses={**NOT_MODIFIED, **responses(400, 401, 404)})
def retrieve_message_batch(message_batch_id: IdPath, request: Request, sessions: SessionsDep,
                           tenant: TenantDep, if_none_match: IfNoneMatch = None) -> Response:
    """The batch, with its `ETag` (304 for a matching `If-None-Match`)."""
    with sessions() as session:
        found = _object(session, message_batches.get_batch(session, message_batch_id, tenant),
                        request)
    return answer(found, if_none_match)


@router.post("/{message_batch_id}/cancel", response_model=MessageBatch,
             responses=responses(400, 401, 404))
def cancel_message_batch(message_batch_id: IdPath, request: Request, sessions: SessionsDep,
                         tenant: TenantDep, actor: ActorDep) -> dict[str, Any]:
    """Stop new requests (canceling); those in flight finish and keep their results. A
    batch that has already ended is returned as it is."""
    job = _found(sessions, message_batch_id, tenant)
    with contextlib.suppress(JobStateError):  # ended: nothing left to cancel
        job = jobs.cancel_job(sessions, job.id, actor)
    job_reads().forget(job.id)
    with sessions() as session:
        return _object(session, job, request)


@router.delete("/{message_batch_id}", response_model=DeletedMessageBatch,
               responses=responses(400, 401, 404))
def delete_message_batch(message_batch_id: IdPath, sessions: SessionsDep,
                         tenant: TenantDep, actor: ActorDep) -> dict[str, str]:
    """Delete an ended batch and its results; one still processing is refused (cancel it
    first), as at Anthropic."""
    job = _found(sessions, message_batch_id, tenant)
    try:
        retention.delete_job(sessions, job.id, tenant, actor)
        job_reads().forget(job.id)
    except JobStateError:
        raise InvalidRequest(f"message batch {message_batch_id} is still processing; cancel "
                             "it and delete it once it has ended") from None
    return {"id": message_batch_id, "type": "message_batch_deleted"}


@router.get("/{message_batch_id}/results", response_class=StreamingResponse,
            responses={200: {"content": {"application/binary": {}},
                             "description": "JSONL: one result per request"},
                       **responses(400, 401, 404)})
def message_batch_results(message_batch_id: IdPath, sessions: SessionsDep,
                          tenant: TenantDep) -> StreamingResponse:
    """Every request's result as JSONL, streamed, once the batch has ended (400 before)."""
    with sessions() as session:  # refused before the stream starts
        job = message_batches.get_batch(session, message_batch_id, tenant)
        message_batches.check_ended(session, job)
    return StreamingResponse(_results(sessions, job.id), media_type="application/binary")


def _results(sessions: sessionmaker[Session], job_id: str) -> Iterator[bytes]:
    with sessions() as session:
        job = session.get_one(Job, job_id)
        yield from output_chunks(message_batches.result_lines(session, job))

"""Ingest: the one pass that turns a JSONL file into a job, or leaves nothing at all.

POST /jobs, POST /v1/batches (quotaflow/compat/openai_batches.py) and `quotaflow run` (through
create_job_in_process) all come here, so "count the tokens, check the tenant's quota,
store the job" is written once. The file is read once, as it streams: each line
is parsed, validated, counted for the tenant's token quota, hashed for in-job
dedup and handed to the database as one row (PostgreSQL COPY, quotaflow/ingest/bulkwrite.py).
Memory does not grow with the file: custom_id uniqueness is the items' unique
index, identical requests are found by a fixed-size filter plus one UPDATE, and
the only per-file list is one BatchRef per batch (quotaflow/dispatch/batch_sizes.py).
Everything happens in one transaction, so a refused file (bad as a whole, over a
limit or over the quota) leaves no job, item or result; the batches are queued after
the commit.

A request with an Idempotency-Key returns the tenant's job made with that key, if
there is one, instead of making another: a client that lost the answer to a long
upload sends it again without creating a second job.
"""

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import IO

import orjson
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from quotaflow import store
from quotaflow.budget.caps import check_cap
from quotaflow.config import Settings
from quotaflow.constants import DEFAULT_TENANT, ENDPOINT_CHAT, OUTPUT_FORMATS, QUEUES
from quotaflow.deployments.catalog import Deployments
from quotaflow.dispatch.batch_sizes import sizes_for
from quotaflow.dispatch.mixing import mixed_order
from quotaflow.dispatch.queues import Dispatcher
from quotaflow.errors import (
    InputFileError,
    InvalidParameter,
    JobStateError,
    LineProblem,
    ModelNotAllowed,
    ServiceUnavailable,
)
from quotaflow.ingest.bulkwrite import DuplicateCustomId, row_writer
from quotaflow.ingest.dedup import pending_batches, share_identical
from quotaflow.ingest.formats import (
    parse_line,
)
from quotaflow.ingest.jsonlines import read_lines
from quotaflow.ingest.linescan import MAX_PROBLEMS, LineScan
from quotaflow.jobs.service import MAX_ATTEMPTS_LIMIT
from quotaflow.models import Item, ItemStatus, Job, JobStatus, utcnow
from quotaflow.tenants import audit, quotas, spend
from quotaflow.tenants.grants import Allowlist

log = logging.getLogger(__name__)

# From this many lines, the items table is analysed once the job is stored: a job the
# planner has no statistics for can cost a scan of all its items per chunk (db.py).
ANALYZE_AT_LINES = 5000


@dataclass(frozen=True)
class JobSpec:
    """What the caller decides about a new job; the file decides the rest."""

    queue: str
    tenant: str = DEFAULT_TENANT
    filename: str | None = None
    metadata: dict[str, str] | None = None
    max_attempts: int | None = None
    input_file_id: str | None = None
    idempotency_key: str | None = None
    endpoint: str | None = None  # /v1/batches: every line must be for this endpoint
    max_lines: int | None = None  # default: QUOTAFLOW_MAX_LINES
    completion_window_s: int | None = None  # default: QUOTAFLOW_COMPLETION_WINDOW_S
    enforce_quota: bool = True  # the tenant's enqueued-token quota (not for `quotaflow run`)
    # "openai" or "anthropic" output lines; None: the format of the file's lines.
    output_format: str | None = None
    # Sharing identical lines: True every one, False none, None where the answer cannot
    # differ (quotaflow/ingest/dedup.py).
    dedup: bool | None = None
    # Seconds its output is kept after it ends; None: QUOTAFLOW_RESULT_RETENTION_S.
    output_expires_after_s: int | None = None
    # The models and deployments its key and tenant may use (None: any). A line outside
    # them fails `model_not_allowed`; with `refuse_disallowed` (a batch that is validated
    # as a whole, as OpenAI's and Anthropic's Batch APIs do) it refuses the file.
    allow: Allowlist | None = None
    refuse_disallowed: bool = False
    # Who creates it: a row of the audit log, in the transaction that stores the job.
    actor: audit.Actor | None = None
    # Its own caps inside each deployment's budget, per minute (quotaflow/budget/caps.py).
    max_rpm: int | None = None
    max_tpm: int | None = None


@dataclass(frozen=True)
class Created:
    """The job, and whether it was made earlier with the same idempotency key; a new
    one's item counts per status (jobs.job_object need not count them again)."""

    job: Job
    replayed: bool = False
    counts: dict[str, int] | None = None


def find_by_key(session: Session, tenant: str, key: str) -> Job | None:
    return session.scalar(select(Job).where(Job.tenant == tenant, Job.idempotency_key == key))


def create_job(sessions: sessionmaker[Session], stream: IO[bytes], *, settings: Settings,
               deployments: Deployments, dispatcher: Dispatcher, spec: JobSpec,
               reopen: Callable[[], IO[bytes]] | None = None,
               job_id: str | None = None) -> Created:
    """Store the file as a job and queue its batches, or raise and store nothing.

    `reopen` gives the file again from its start; it is used only to name both lines of
    a duplicate custom_id (a seekable stream is rewound when it is not given).
    `job_id` names a job row already committed as `validating` (POST /v1/batches, so
    that status is seen while the file is read): it is filled in place, holding the row
    locked meanwhile; on a refusal only its lines are rolled back.
    """
    if spec.queue not in QUEUES:
        raise InvalidParameter("queue", f"unknown queue {spec.queue!r}; choose one of "
                                        f"{', '.join(QUEUES)}")
    if spec.output_format is not None and spec.output_format not in OUTPUT_FORMATS:
        raise InvalidParameter("output_format", f"unknown output_format {spec.output_format!r}; "
                                                f"choose one of {', '.join(OUTPUT_FORMATS)}")
    if spec.max_attempts is not None and not 1 <= spec.max_attempts <= MAX_ATTEMPTS_LIMIT:
        raise InvalidParameter("max_attempts", f"max_attempts must be between 1 and "
                                               f"{MAX_ATTEMPTS_LIMIT}, got {spec.max_attempts}")
    check_cap("max_rpm", spec.max_rpm)
    check_cap("max_tpm", spec.max_tpm)
    if spec.idempotency_key is not None and job_id is None:
        with sessions() as session:
            if (earlier := find_by_key(session, spec.tenant, spec.idempotency_key)) is not None:
                return Created(earlier, replayed=True)
    with sessions.begin() as session:
        if job_id is not None:
            lock_validating(session, job_id)
            scan = _fill(session, job_id, stream, spec, settings, deployments, reopen)
        elif not insert_job(session, job_id := f"batch_{uuid.uuid4().hex}", spec, settings,
                            JobStatus.VALIDATING):
            scan = None  # the same key, committed while this request waited for it
        else:
            scan = _fill(session, job_id, stream, spec, settings, deployments, reopen)
    with sessions() as session:
        if scan is None:
            assert spec.idempotency_key is not None
            earlier = find_by_key(session, spec.tenant, spec.idempotency_key)
            assert earlier is not None
            return Created(earlier, replayed=True)
        job = session.get_one(Job, job_id)
    if scan.total >= ANALYZE_AT_LINES:
        store.for_sessions(sessions).refresh_statistics(sessions, Item.__table__)
    try:
        batches = (mixed_order(scan.batches, scan.batch_loads)
                   if settings.admission_order == "mixed" else scan.batches)
        dispatcher.dispatch(spec.queue, batches)
    except ServiceUnavailable as exc:
        # The job is stored whole; only its messages are not. Answering 503 now would
        # invite a second upload of a job that exists, so its pending lines are made
        # due at once instead: the reaper queues them at its first round with a broker.
        _due_now(sessions, job_id)
        log.warning("job %s stored, its batches queued later: %s", job_id, exc)
    return Created(job, counts={ItemStatus.FAILED: scan.total - scan.valid,
                                ItemStatus.PENDING: scan.valid})


def _due_now(sessions: sessionmaker[Session], job_id: str) -> None:
    items = Item.__table__.c
    with sessions.begin() as session:
        session.execute(update(Item.__table__)
                        .where(items.job_id == job_id, items.status == ItemStatus.PENDING)
                        .values(lease_expires_at=utcnow()))


def lock_validating(session: Session, job_id: str) -> None:
    """Hold a committed `validating` job's row for this transaction (FOR NO KEY UPDATE,
    which leaves results' foreign key checks alone): the sweep that fails abandoned
    validations (batches.fail_abandoned) skips a row held this way."""
    held = session.scalar(select(Job.id).where(Job.id == job_id,
                                               Job.status == JobStatus.VALIDATING)
                          .with_for_update(key_share=True))
    if held is None:
        raise JobStateError(f"job {job_id} is no longer validating (cancelled, or failed "
                            "as abandoned); create it again")


def insert_job(session: Session, job_id: str, spec: JobSpec, settings: Settings, status: str,
               **values: object) -> bool:
    """The job's row; False when the tenant already has a job with this idempotency key
    (PostgreSQL waits for a transaction making one to end, and says so if it commits)."""
    now = utcnow()
    window = spec.completion_window_s or settings.completion_window_s
    row = {"id": job_id, "status": status, "queue": spec.queue, "endpoint": spec.endpoint or "",
           "input_filename": spec.filename, "total": 0, "metadata": spec.metadata,
           "created_at": now, "max_attempts": spec.max_attempts, "tenant": spec.tenant,
           "expires_at": now + timedelta(seconds=window), "input_file_id": spec.input_file_id,
           "idempotency_key": spec.idempotency_key, "dedup": spec.dedup,
           "output_expires_after_s": spec.output_expires_after_s
           or settings.result_retention_s or None,
           "max_rpm": spec.max_rpm, "max_tpm": spec.max_tpm} | values
    made = session.execute(store.of(session).insert_ignore(Job.__table__).values(**row)
                           .returning(Job.__table__.c.id))
    return made.scalar() is not None


def _fill(session: Session, job_id: str, stream: IO[bytes], spec: JobSpec, settings: Settings,
          deployments: Deployments, reopen: Callable[[], IO[bytes]] | None) -> LineScan:
    """Items and error rows for every line, then the checks that need the whole file."""
    room = quotas.headroom(session, settings, spec.tenant) if spec.enforce_quota else None
    lease_until = utcnow() + timedelta(seconds=settings.queue_patience_s)
    scan = LineScan(job_id, settings, deployments, room, spec.max_lines, spec.endpoint,
                    dedup=spec.dedup, allow=spec.allow,
                    refuse_disallowed=spec.refuse_disallowed)
    try:
        with row_writer(session, job_id, lease_until) as writer:
            scan.run(stream, writer)
            if scan.not_allowed:
                first = scan.not_allowed[0]
                raise ModelNotAllowed(f"line {first.line_no}: {first.reason}; nothing of the "
                                      "batch was stored", scan.not_allowed)
            if scan.wrong_endpoint:
                raise InputFileError(f"the input file has requests for another endpoint than "
                                     f"{spec.endpoint}", scan.wrong_endpoint[:MAX_PROBLEMS])
    except DuplicateCustomId as duplicate:
        if reopen is None and stream.seekable():
            reopen = lambda: (stream.seek(0), stream)[1]  # noqa: E731
        raise _duplicate_error(duplicate, reopen, settings.max_line_bytes) from None
    if scan.total == 0:
        raise InputFileError("the file is empty: it has no request lines")
    if not scan.valid:
        raise InputFileError("no line of the file is a valid request", scan.problems)
    # Suspects: bodies that may repeat an earlier line's (None: too many to list them).
    if (scan.suspects is None or scan.suspects) and share_identical(session, job_id,
                                                                     scan.suspects):
        scan.batches = pending_batches(session, job_id, sizes_for(settings))
        scan.batch_loads = []  # other batches now: queued in line order
    if spec.enforce_quota:
        quotas.admit(session, settings, spec.tenant, scan.tokens)
        cost, _ = spend.estimate(deployments, ((t.route, t) for t in scan.routes.values()))
        spend.admit(session, settings, spec.tenant, cost)
    output_format = spec.output_format or scan.input_format
    if output_format != "openai" and scan.endpoint != ENDPOINT_CHAT:
        raise InvalidParameter("output_format", f"Anthropic output lines carry Messages; the "
                                                f"file's requests are for {scan.endpoint}: use "
                                                "output_format=openai")
    audit.record(session, spec.actor, "create", "job", job_id)
    session.execute(update(Job).where(Job.id == job_id).values(
        total=scan.total, endpoint=scan.endpoint or "", status=JobStatus.IN_PROGRESS,
        in_progress_at=utcnow(), enqueued_tokens=scan.tokens, output_format=output_format))
    return scan


def _duplicate_error(duplicate: DuplicateCustomId, reopen: Callable[[], IO[bytes]] | None,
                     max_line_bytes: int) -> InputFileError:
    """The refusal naming both lines, as the user needs to find them."""
    custom_id, first, second = duplicate.custom_id, duplicate.first_line, duplicate.second_line
    if first is None and reopen is not None:
        first, second = _locate(reopen(), custom_id, max_line_bytes)
    if first is None or second is None:
        return InputFileError(f"duplicate custom_id {custom_id!r}; each custom_id must be "
                              "unique within a file")
    return InputFileError(
        f"duplicate custom_id {custom_id!r} on lines {first} and {second}; each custom_id "
        "must be unique within a file", [LineProblem(second, f"duplicate custom_id {custom_id!r}")])


def _locate(stream: IO[bytes], custom_id: str, max_line_bytes: int) -> tuple[int | None, ...]:
    """The first two lines with this custom_id. Only for a refused file: PostgreSQL names
    the id, not the lines, and keeping every custom_id in memory is what ingest avoids."""
    needle = orjson.dumps(custom_id)
    # A shorthand line's custom_id is its line number, which no byte of it spells.
    numbered = int(custom_id) if custom_id.isascii() and custom_id.isdigit() else 0
    found: list[int] = []
    for line_no, raw in read_lines(stream, max_line_bytes):
        if raw is None or not (needle in raw or b"\\" in raw or line_no == numbered):
            continue
        if parse_line(line_no, raw).custom_id == custom_id:
            found.append(line_no)
            if len(found) == 2:
                return tuple(found)
    return None, None


def create_job_in_process(
    sessions: sessionmaker[Session],
    stream: IO[bytes],
    *,
    settings: Settings,
    deployments: Deployments,
    dispatcher: Dispatcher,
    queue: str,
    filename: str | None = None,
    metadata: dict[str, str] | None = None,
    max_attempts: int | None = None,
    tenant: str = DEFAULT_TENANT,
    output_format: str | None = None,
    dedup: bool | None = None,
    max_rpm: int | None = None,
    max_tpm: int | None = None,
) -> Job:
    """Store a JSONL file as a job and dispatch its batches, or store nothing at all.

    Lines that fail validation become failed items with their line number and
    reason; the job runs its good lines. A file-level problem (empty, too big,
    duplicate custom_id, no valid line) raises InputFileError and nothing of the file
    is written. Identical requests whose answer cannot differ (or all, or none, as
    `dedup` says) are stored once as sent and otherwise as waiting for that one's
    answer. This is ingest's entry point for `quotaflow run` and other
    in-process callers, which the tenant token quota (an API matter) does not apply to.
    """
    spec = JobSpec(queue=queue, tenant=tenant, filename=filename, metadata=metadata,
                   max_attempts=max_attempts, enforce_quota=False,
                   output_format=output_format, dedup=dedup, max_rpm=max_rpm,
                   max_tpm=max_tpm)
    return create_job(sessions, stream, settings=settings, deployments=deployments,
                      dispatcher=dispatcher, spec=spec).job

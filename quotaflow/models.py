"""The tables: jobs, their input items, and one result per item; tenants, their
API keys and uploaded files.

Items are keyed by (job_id, line_no) and unique on (job_id, custom_id), so
results come back in input order and a custom_id can never hold two results.
A result row is written once (insert-or-ignore), which is what makes a batch
that runs twice after a crash harmless.
"""

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Computed,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    Numeric,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeEngine

from quotaflow import jsoncodec

# SQL NULL for Python None, so "IS NULL" means "absent" (an invalid line has no body).
JsonType = JSON(none_as_null=True).with_variant(JSONB(none_as_null=True), "postgresql")


class JsonText(TypeDecorator[Any]):
    """A request's body or a provider's answer: JSON text in a text column on PostgreSQL
    (migrations 0020, 0021), JSON elsewhere. Each is written once, as quotaflow's own
    output of an object it parsed (ingest's body) or as text already parsed (the
    answer, kept as it came): JSON by construction. A json column parsed each one again
    on the way in (ingest's COPY, every chunk of results), and jsonb also printed it
    again on every read (migrations 0018, 0019): work done twice. Read through this
    type, it is an object again."""

    impl = JSON
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "postgresql":
            return dialect.type_descriptor(Text())
        return dialect.type_descriptor(JSON(none_as_null=True))

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if dialect.name != "postgresql" or value is None:
            return value
        return jsoncodec.dumps_text(value)

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        if dialect.name != "postgresql" or value is None:
            return value
        return jsoncodec.loads(value)


class UtcDateTime(TypeDecorator[datetime]):
    """A moment: stored in UTC, always read back aware (in UTC), whatever the database.

    PostgreSQL's timestamptz keeps the zone; SQLite keeps naive text, so its moments
    come back without one. Through this type every model's timestamps (and `max()` of
    them) compare with utcnow() on both stores, with no helper at the reading site.
    A naive moment given is taken to be UTC already.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None or value.tzinfo is UTC:
            return value
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)

    def process_result_value(self, value: datetime | None,
                             dialect: Dialect) -> datetime | None:
        if value is None or value.tzinfo is not None:
            return value
        return value.replace(tzinfo=UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    # Every model is a declarative table: a Table, not any FromClause, for core statements.
    __table__: ClassVar[Table]
    type_annotation_map = {dict[str, Any]: JsonType, datetime: UtcDateTime()}  # noqa: RUF012


class JobStatus:
    """OpenAI Batch statuses, which job objects report as they are."""

    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    ACTIVE = (VALIDATING, IN_PROGRESS, FINALIZING, CANCELLING)
    FINAL = (COMPLETED, FAILED, EXPIRED, CANCELLED)


class ItemStatus:
    """Where one input line is on its way to a result."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    # An identical request earlier in the job is sent instead; its result is shared.
    WAITING = "waiting"
    # Never sent: the tenant's monthly spend limit was reached (quotaflow/tenants/spend.py).
    SPEND_LIMITED = "spend_limited"
    OPEN = (PENDING, RUNNING, WAITING)


# A job's status that ends its unanswered items, and the status they end with: a running
# batch's stop check (execution/stopping.py) and a provider batch's lines
# (offload/collect.py) both close items by it.
ITEMS_ENDED_BY = {JobStatus.CANCELLING: ItemStatus.CANCELLED,
                  JobStatus.CANCELLED: ItemStatus.CANCELLED,
                  JobStatus.EXPIRED: ItemStatus.EXPIRED}


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    status: Mapped[str] = mapped_column(String(16), index=True)
    queue: Mapped[str] = mapped_column(String(16))
    endpoint: Mapped[str] = mapped_column(String(64))
    input_filename: Mapped[str | None] = mapped_column(String(255))
    total: Mapped[int] = mapped_column(Integer, default=0)
    metadata_: Mapped[dict[str, Any] | None] = mapped_column("metadata")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    in_progress_at: Mapped[datetime | None]
    finalizing_at: Mapped[datetime | None]
    completed_at: Mapped[datetime | None]
    failed_at: Mapped[datetime | None]
    cancelling_at: Mapped[datetime | None]
    cancelled_at: Mapped[datetime | None]
    expired_at: Mapped[datetime | None]
    expires_at: Mapped[datetime | None]
    # Tries per request at the provider; None: QUOTAFLOW_PROVIDER_MAX_ATTEMPTS.
    max_attempts: Mapped[int | None] = mapped_column(Integer)
    # Whose job it is: the API key's tenant ("default" for embedded and auth-off jobs).
    tenant: Mapped[str] = mapped_column(String(64), default="default",
                                        server_default="default")
    # The uploaded file a job made through POST /v1/batches was created from.
    input_file_id: Mapped[str | None] = mapped_column(String(64))
    # Estimated prompt tokens of its requests, counted against the tenant's quota.
    enqueued_tokens: Mapped[int | None] = mapped_column(BigInteger)
    # OpenAI's `errors.data` of a batch whose input file was refused as a whole.
    errors: Mapped[dict[str, Any] | None] = mapped_column(JsonType)
    # The Idempotency-Key the job was created with: the same tenant sending the same key
    # again gets this job back instead of a second one (a retried upload).
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    # Why a running job stopped sending before its lines were done: "spend_limit_exceeded"
    # (quotaflow/tenants/spend.py). Its unsent lines end with that code; None: it did not stop.
    stop_reason: Mapped[str | None] = mapped_column(String(32))
    # When the webhook sweep turned the job's end into events (quotaflow/webhooks/outbox.py);
    # None while it runs, and for an ended job not yet swept (migration 0011).
    notified_at: Mapped[datetime | None]
    # Its output lines: "openai" (batch output lines) or "anthropic" (Message Batches
    # results); by default the format of its input file's lines.
    output_format: Mapped[str] = mapped_column(String(16), default="openai",
                                               server_default="openai")
    # Sharing identical lines (quotaflow/ingest/dedup.py): None follows the rule (only lines
    # whose answer cannot differ), True shares every identical line, False none.
    dedup: Mapped[bool | None] = mapped_column(Boolean)
    # Retention (quotaflow/compat/retention.py, migration 0016): seconds the output is kept after
    # the job ends (None: kept); when its results were deleted (on request or expiry: the
    # job is then a tombstone), and when the sweep had removed their last row; what the
    # tombstone still reports ({"reason", "counts", "usage"}).
    output_expires_after_s: Mapped[int | None] = mapped_column(Integer)
    deleted_at: Mapped[datetime | None]
    purged_at: Mapped[datetime | None]
    tombstone: Mapped[dict[str, Any] | None] = mapped_column(JsonType)
    # Its own caps inside each deployment's budget (requests and tokens per minute; None:
    # none), beside its tenant's (quotaflow/budget/caps.py, migration 0025).
    max_rpm: Mapped[int | None] = mapped_column(BigInteger)
    max_tpm: Mapped[int | None] = mapped_column(BigInteger)


Index("ix_jobs_tenant_created", Job.tenant, Job.created_at)
# The sweep's question (which jobs ended unnoticed?) among the unswept jobs alone.
UNNOTIFIED = "notified_at IS NULL"
Index("ix_jobs_unnotified", Job.status,
      postgresql_where=text(UNNOTIFIED), sqlite_where=text(UNNOTIFIED))
Index("uq_jobs_tenant_idempotency_key", Job.tenant, Job.idempotency_key, unique=True)
# The retention sweep's questions (migration 0016): which live outputs may expire, and
# which deleted jobs still have rows to remove.
RETAINED = "deleted_at IS NULL AND output_expires_after_s IS NOT NULL"
Index("ix_jobs_retained", Job.status, postgresql_where=text(RETAINED),
      sqlite_where=text(RETAINED))
UNPURGED = "deleted_at IS NOT NULL AND purged_at IS NULL"
Index("ix_jobs_unpurged", Job.deleted_at, postgresql_where=text(UNPURGED),
      sqlite_where=text(UNPURGED))


# Open: pending, running or waiting (ItemStatus.OPEN). A generated column, so that
# the claim (pending -> running) changes no indexed value and is a HOT update.
IS_OPEN = "status IN ('pending', 'running', 'waiting')"


class Item(Base):
    __tablename__ = "items"
    __table_args__ = (
        UniqueConstraint("job_id", "custom_id", name="uq_items_job_custom_id"),
        # A job's open items in line order: its last open line (is the job done?), the
        # reaper's candidates. Neither status nor lease_expires_at is in any index, so
        # an item's claim and its lease renewals are HOT updates (migration 0017).
        Index("ix_items_job_open", "job_id", "line_no",
              postgresql_where=text("is_open"), sqlite_where=text("is_open")),
        # Looked up only by equality: a hash index on PostgreSQL (migration 0004).
        Index("ix_items_body_hash", "body_hash", postgresql_using="hash"),
        Index("ix_items_job_duplicate_of", "job_id", "duplicate_of",
              postgresql_where=text("duplicate_of IS NOT NULL"),
              sqlite_where=text("duplicate_of IS NOT NULL")),
    )

    # No foreign key on PostgreSQL (migration 0004): its per-row check was the largest
    # cost of ingest, and items are only written with their job, in its transaction.
    job_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    line_no: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    custom_id: Mapped[str | None] = mapped_column(String(512))
    body: Mapped[dict[str, Any] | None] = mapped_column(JsonText())
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(64))
    # Running: when the claim's lease runs out. Pending: when its queue message
    # is presumed lost and the reaper sends another.
    lease_expires_at: Mapped[datetime | None]
    # A digest of the request body: identical requests are sent once.
    body_hash: Mapped[str | None] = mapped_column(String(64))
    # The name of the request's route (Deployments.route_name_for), decided at ingest:
    # placement and execution read it rather than routing the model again.
    route: Mapped[str | None] = mapped_column(String(255))
    # The line whose call this item shares (status `waiting` until it has a result).
    duplicate_of: Mapped[int | None] = mapped_column(Integer)
    # status in ItemStatus.OPEN, kept by the database (STORED on PostgreSQL, VIRTUAL on
    # SQLite); never written. Queries that want the open items name it, so that they
    # read ix_items_job_open.
    is_open: Mapped[bool] = mapped_column(Boolean, Computed(IS_OPEN, persisted=True),
                                          nullable=True)


class Result(Base):
    __tablename__ = "results"

    # The foreign key is SQLite's only: PostgreSQL dropped it (migration 0017), its
    # per-row check cost a worker's chunk write as much as the rest of the insert.
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    line_no: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    custom_id: Mapped[str | None] = mapped_column(String(512))
    request_id: Mapped[str] = mapped_column(String(64))
    status_code: Mapped[int | None] = mapped_column(Integer)
    response: Mapped[dict[str, Any] | None] = mapped_column(JsonText())
    error: Mapped[dict[str, Any] | None]
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    # Set when this answer is another request's, shared because the bodies are
    # identical: {"id", "custom_id", "batch_id"} of the result that was sent.
    shared_from: Mapped[dict[str, Any] | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Provenance (migration 0009), where a call was made: the deployment of the last call,
    # the calls made, when that call was admitted, sent and answered, and the provider's
    # x-request-id (the output line's response.request_id; ours where it gave none).
    deployment: Mapped[str | None] = mapped_column(String(255))
    attempts: Mapped[int | None] = mapped_column(Integer)
    admitted_at: Mapped[datetime | None]
    sent_at: Mapped[datetime | None]
    answered_at: Mapped[datetime | None]
    provider_request_id: Mapped[str | None] = mapped_column(String(255))


class Tenant(Base):
    """Who owns jobs and files; a key of one tenant never sees another's."""

    __tablename__ = "tenants"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    # Prompt tokens its unfinished batches may hold; None: QUOTAFLOW_MAX_ENQUEUED_TOKENS.
    max_enqueued_tokens: Mapped[int | None] = mapped_column(BigInteger)
    # What it may spend per calendar month; None: QUOTAFLOW_MAX_MONTHLY_SPEND.
    max_monthly_spend: Mapped[float | None] = mapped_column(Numeric(18, 6, asdecimal=False))
    # Its weight in a shared deployment's budget against other tenants' bulk work
    # (quotaflow/budget/fair_share.py): 3 gets three times the share of a tenant of weight 1.
    weight: Mapped[float] = mapped_column(Float, default=1.0, server_default="1")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # The models and deployments every key of the tenant may use (lists of names; None:
    # any), beside each key's own (quotaflow/tenants/grants.py, migration 0024).
    allowed_models: Mapped[list[str] | None] = mapped_column(JsonType)
    allowed_deployments: Mapped[list[str] | None] = mapped_column(JsonType)
    # Its caps inside each deployment's budget, for all its jobs together (requests and
    # tokens per minute; None: none): quotaflow/budget/caps.py, migration 0025.
    max_rpm: Mapped[int | None] = mapped_column(BigInteger)
    max_tpm: Mapped[int | None] = mapped_column(BigInteger)


class Spend(Base):
    """What a job's calls cost on one deployment in one month: the ledger spend limits and
    job costs read. Written with the results it bills, in their transaction, from the rows
    actually inserted, so a batch stored twice is billed once (quotaflow/tenants/spend.py)."""

    __tablename__ = "spend"
    __table_args__ = (Index("ix_spend_tenant_month", "tenant", "month"),)

    job_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    deployment: Mapped[str] = mapped_column(String(255), primary_key=True)
    month: Mapped[str] = mapped_column(String(7), primary_key=True)  # "2026-11", UTC
    tenant: Mapped[str] = mapped_column(String(64))
    requests: Mapped[int] = mapped_column(BigInteger, default=0)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cached_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    # In `currency`, the deployments' one; both NULL where the deployment had no prices.
    cost: Mapped[float | None] = mapped_column(Numeric(24, 9, asdecimal=False))
    currency: Mapped[str | None] = mapped_column(String(3))


class ApiKey(Base):
    """An API key, stored only as its SHA-256 digest: the key itself is shown once."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(ForeignKey("tenants.name", ondelete="CASCADE"))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None]
    # May read what spans every tenant (GET /limits): `quotaflow keys create --operator`.
    operator: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # What it may do: "read", "submit" or "admin" (quotaflow/tenants/grants.py); keys made
    # before scopes are "admin" (migration 0024).
    scope: Mapped[str] = mapped_column(String(16), default="admin", server_default="admin")
    # When it stops working: its own expiry, or the end of a rotation's grace period, when
    # `replaced_by` names the key that took over. None: never.
    expires_at: Mapped[datetime | None]
    replaced_by: Mapped[str | None] = mapped_column(String(64))
    # Written at most once a minute per key (quotaflow/tenants/key_cache.py), not per request.
    last_used_at: Mapped[datetime | None]
    allowed_models: Mapped[list[str] | None] = mapped_column(JsonType)
    allowed_deployments: Mapped[list[str] | None] = mapped_column(JsonType)


class File(Base):
    """An uploaded file (OpenAI's file object); its bytes live in file_chunks."""

    __tablename__ = "files"
    __table_args__ = (Index("ix_files_tenant_created", "tenant", "created_at"),
                      Index("ix_files_expires_at", "expires_at",
                            postgresql_where=text("expires_at IS NOT NULL"),
                            sqlite_where=text("expires_at IS NOT NULL")))

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64))
    filename: Mapped[str] = mapped_column(String(255))
    purpose: Mapped[str] = mapped_column(String(32))
    bytes: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # When it is gone (its `expires_after`, else QUOTAFLOW_FILE_RETENTION_S; None: kept).
    # A DELETE sets it to now: the bytes are then removed a bounded transaction at a time.
    expires_at: Mapped[datetime | None]


class FileChunk(Base):
    """One piece of a file's bytes, written as the upload streams in."""

    __tablename__ = "file_chunks"

    file_id: Mapped[str] = mapped_column(ForeignKey("files.id", ondelete="CASCADE"),
                                         primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class BrokerRun(Base):
    """The broker run id the reaper last acted on: kept in PostgreSQL, not in the broker,
    so a broker that comes back empty cannot take the evidence of its restart with it."""

    __tablename__ = "broker_runs"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(64))
    seen_at: Mapped[datetime] = mapped_column(default=utcnow)


class AuditEvent(Base):
    """One action on a job, file, batch, key or webhook endpoint: who (key, tenant, client
    address), what, when. Written in the action's transaction (quotaflow/tenants/audit.py)."""

    __tablename__ = "audit_events"
    __table_args__ = (Index("ix_audit_events_tenant_id", "tenant", "id"),
                      Index("ix_audit_events_at", "at"))

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"),
                                    primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    tenant: Mapped[str] = mapped_column(String(64))
    # The key that acted; None for `quotaflow keys` on the database (the operator's CLI).
    key_id: Mapped[str | None] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(32))  # create, cancel, retry, delete, ...
    object_type: Mapped[str] = mapped_column(String(32))  # job, batch, file, key, ...
    object_id: Mapped[str] = mapped_column(String(128))
    client: Mapped[str | None] = mapped_column(String(64))  # the client's address

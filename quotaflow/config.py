"""quotaflow's one settings object.

Everything is read from the environment (prefix QUOTAFLOW_) or a .env file;
the deployments file it names (quotaflow/deployments.py) says which providers
serve which models. API keys are never in either: a deployment names the
environment variable that holds its key, and the key is read only at call time.
"""

import ipaddress
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    field_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from quotaflow.constants import QUEUE_BULK, QUEUE_REALTIME, QUEUE_STANDARD
from quotaflow.deployments import Deployments, load_deployments
from quotaflow.errors import ConfigError

# Svix's schedule: at once, then 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h (about a day).
WEBHOOK_RETRY_SCHEDULE_S = (0.0, 5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 36000.0)

class Settings(BaseSettings):
    """Every knob of quotaflow, read from QUOTAFLOW_* environment variables."""

    model_config = SettingsConfigDict(env_prefix="QUOTAFLOW_", env_file=".env", extra="ignore")

    database_url: str = "sqlite:///quotaflow.db"
    broker_url: str | None = None
    # The limiter's Redis; defaults to the broker's. Unset both: in-process limiter.
    redis_url: str | None = None
    deployments_file: Path | None = None
    api_url: str = "http://127.0.0.1:8000"
    api_host: str = "127.0.0.1"
    api_port: int = 8000

    # Items per Celery message: small enough that a lost worker costs little,
    # large enough that one message amortises its round trips (a message, its events,
    # its claim and its report cost a worker about as much CPU as 25 requests).
    batch_size: int = Field(default=100, gt=0, le=10_000)
    # A file for POST /jobs (`quotaflow submit`): ingest streams it in constant memory,
    # so these bound the database's work, not the API's memory.
    max_file_bytes: int = Field(default=1024 * 1024 * 1024, gt=0)
    # OpenAI caps a batch input line's request body; 1 MiB keeps a bad line from
    # exhausting memory while leaving room for long prompts.
    max_line_bytes: int = Field(default=1024 * 1024, gt=0)
    # Requests per job made through POST /jobs; POST /v1/batches keeps OpenAI's 50,000
    # (max_batch_lines), so code written for OpenAI meets the limits it expects.
    max_lines: int = Field(default=2_000_000, gt=0)
    max_batch_lines: int = Field(default=50_000, gt=0)
    # POST /v1/messages/batches: Anthropic's limits on a Message Batch, 100,000 requests
    # or 256 MB of body (the body is held whole while its requests are stored).
    max_message_batch_requests: int = Field(default=100_000, gt=0)
    max_message_batch_bytes: int = Field(default=256 * 1024 * 1024, gt=0)

    # A job's completion window, as OpenAI's "24h": then unsent requests expire.
    completion_window_s: int = Field(default=24 * 3600, gt=0)
    # How long a job's output (its results and its lines' bodies) is kept after the job
    # ends, for jobs whose submitter set no `output_expires_after`; then the worker's sweep
    # deletes it and the job stays as a tombstone (quotaflow/retention.py). 30 days, as
    # OpenAI keeps batch output: clients written for it download within that, and the
    # results table stops growing without bound. Fixed on each job when it is made, so a
    # change applies to new jobs only. 0: kept until deleted.
    result_retention_s: int = Field(default=30 * 24 * 3600, ge=0)
    # The same for uploads (POST /v1/files) sent without `expires_after`: OpenAI's default
    # for batch files is 30 days too. 0: kept until deleted.
    file_retention_s: int = Field(default=30 * 24 * 3600, ge=0)
    # A claim's lease, renewed every third of it while its batch runs: a lease that runs
    # out means a dead worker, whose items are free again within this (plus a reap).
    lease_seconds: int = Field(default=30, gt=0)
    # PostgreSQL ends a worker's transaction that waits this long for the worker (cut off
    # from the database mid-transaction), so its locks do not stall the other workers
    # until TCP notices it is gone (quotaflow/db.py, end_idle_transactions_after).
    worker_idle_in_transaction_s: float = Field(default=10.0, gt=0)
    # How often the workers look for expired leases of dead workers.
    reap_interval_s: float = Field(default=10.0, gt=0)
    # How long a pending item may wait for its queue message before the reaper
    # presumes the message lost (broker restarted empty, dispatch failed) and
    # sends another. Like Redis's own redelivery, an hour by default: a long queue is
    # not a lost message. A broker that restarted is noticed at once instead (its
    # run id changes; workers/reaper.py).
    queue_patience_s: float = Field(default=3600.0, gt=0)
    # A batch handed back to wait for budget is sent again by the reaper if its
    # delayed message has not come this long after its countdown (the worker holding
    # it died, or the broker lost it).
    defer_grace_s: float = Field(default=30.0, gt=0)
    # Tries per request at the provider, unless a job asks for another number.
    provider_max_attempts: int = Field(default=5, gt=0, le=20)
    # The longest wait a provider's Retry-After (or a rate limit's reset) is believed for:
    # a longer one is logged and clamped; the limiter still protects the budget.
    max_retry_after_s: float = Field(default=60.0, gt=0)
    # Identical requests (same endpoint and body) within a job are sent once and the
    # answer shared where it cannot differ (quotaflow/dedup.py: temperature 0 without
    # sampling, embeddings, moderations). Off: each line is sent unless its job asks.
    dedup: bool = True
    # Reuse an earlier job's successful answer to an identical request instead of
    # calling again: a cache, for deterministic requests (quotaflow/reuse.py).
    dedup_across_jobs: bool = False
    # Celery's Redis transport redelivers unacked messages after visibility_timeout;
    # the task limit stays well under it so a running batch is never delivered twice.
    visibility_timeout: int = Field(default=3600, gt=60)
    task_time_limit: int = Field(default=900, gt=0)

    # Priority floors: the share of each bucket a queue must leave for higher
    # priorities (docs/architecture.md, "The limiter").
    floor_realtime: float = Field(default=0.0, ge=0, lt=1)
    floor_standard: float = Field(default=0.05, ge=0, lt=1)
    floor_bulk: float = Field(default=0.20, ge=0, lt=1)
    # The order a job's batches are queued in: "mixed" spends RPM and TPM together by
    # interleaving light and heavy batches at the job's own mix (quotaflow/mixing.py);
    # "fifo" keeps line order.
    admission_order: Literal["mixed", "fifo"] = "mixed"
    # A batch told to wait longer than this goes back to the queue with that
    # countdown instead of holding a worker.
    max_inline_wait_s: float = Field(default=5.0, ge=0)
    # Share each deployment's budget between tenants with work by their weights
    # (quotaflow/fairshare.py); false: whoever's batches come first take it all.
    fair_share: bool = True

    # Set by `quotaflow worker --deployment NAME`: the one local deployment whose model
    # this worker process loads. A worker without it loads no model at all.
    worker_deployment: str | None = None
    # Set by `quotaflow worker --metrics-port PORT`: the worker's main process serves its
    # pool's Prometheus metrics there (workers/metrics.py). None: no metrics server.
    worker_metrics_port: int | None = Field(default=None, gt=0, lt=65536)

    # Log lines as plain text (with the job id and other context as key=value) or as
    # one JSON object each (quotaflow/logs.py).
    log_format: Literal["text", "json"] = "text"

    flower_basic_auth: str | None = None
    flower_port: int = 5555

    # API keys and tenants (README, "OpenAI-compatible Batch API"). Off only for
    # development: every request then belongs to the tenant "default".
    auth: bool = True
    # The key the CLI sends as `Authorization: Bearer ...`; read from the environment only.
    api_key: SecretStr | None = None
    # How long `quotaflow submit` waits for the API's answer to an upload (the API stores
    # the whole file before it answers) before it sends it again with the same
    # Idempotency-Key; a busy API is never taken for an unreachable one.
    submit_timeout_s: float = Field(default=1800.0, gt=0)
    # POST /v1/files refuses larger uploads while they stream (OpenAI's limit is 200 MB).
    max_upload_bytes: int = Field(default=200 * 1024 * 1024, gt=0)
    # Prompt tokens one tenant's unfinished batches may hold, like OpenAI's enqueued-token
    # limit; a tenant's own limit (`quotaflow keys create --max-enqueued-tokens`) overrides
    # it. None: no limit.
    max_enqueued_tokens: int | None = Field(default=None, gt=0)
    # What one tenant may spend per calendar month (UTC), in the deployments' currency,
    # at their prices (quotaflow/spend.py); a tenant's own limit (`quotaflow keys create
    # --max-spend`) overrides it. None: no limit.
    max_monthly_spend: float | None = Field(default=None, ge=0)

    # Webhooks (quotaflow/webhooks/). The master key each endpoint's signing secret is
    # derived from (HMAC-SHA256 of the endpoint id): secrets are never stored, so without
    # it no endpoint can be created and no event signed. Changing it changes every secret.
    webhook_secret_key: SecretStr | None = None
    # Whether this process's worker delivers webhooks (a thread of its main process).
    webhook_delivery: bool = True
    # Seconds before each attempt of a delivery: the first is after the job's end, each
    # next one after the previous failure; after the last, the delivery has failed.
    # Comma-separated in the environment: QUOTAFLOW_WEBHOOK_RETRY_SCHEDULE_S=0,5,300.
    webhook_retry_schedule_s: Annotated[tuple[float, ...], NoDecode] = WEBHOOK_RETRY_SCHEDULE_S
    # How long one attempt may take (connect, send, answer), as Svix's 15 s roughly.
    webhook_timeout_s: float = Field(default=10.0, gt=0, le=120)
    # How often the delivery loop looks for ended jobs and due deliveries.
    webhook_poll_interval_s: float = Field(default=1.0, gt=0)
    # Networks endpoints may reach although they are loopback, private, link-local,
    # unspecified or multicast (server-side request forgery guard), comma-separated:
    # QUOTAFLOW_WEBHOOK_ALLOWED_NETWORKS=127.0.0.0/8,10.1.0.0/16.
    webhook_allowed_networks: Annotated[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network,
                                              ...], NoDecode] = ()

    # Provider batch APIs (quotaflow/pbatch/): whether this worker runs the loop that
    # groups queued lines into provider batches, uploads them and polls them (a thread of
    # its main process); how long a line waits for more to join its provider batch; how
    # often a provider batch is polled; how long a claim of one lasts (a dead worker's
    # lapses, and another worker resumes it); and how long before a job's expires_at its
    # lines still out at a provider batch move to realtime deployments.
    provider_batch_loop: bool = True
    provider_batch_gather_s: float = Field(default=60.0, ge=0)
    provider_batch_poll_s: float = Field(default=30.0, gt=0)
    provider_batch_lease_s: float = Field(default=300.0, gt=0)
    provider_batch_window_margin_s: float = Field(default=3600.0, ge=0)

    @field_validator("webhook_retry_schedule_s", mode="before")
    @classmethod
    def _schedule(cls, value: object) -> object:
        if isinstance(value, str):
            value = tuple(part.strip() for part in value.split(",") if part.strip())
        if isinstance(value, tuple | list):
            if not value:
                raise ValueError("give at least one delay (0: at once)")
            if any(float(delay) < 0 for delay in value):
                raise ValueError("delays must be 0 or more seconds")
        return value

    @field_validator("webhook_allowed_networks", mode="before")
    @classmethod
    def _networks(cls, value: object) -> object:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, tuple | list):
            try:
                return tuple(ipaddress.ip_network(str(net), strict=False) for net in value)
            except ValueError as exc:
                raise ValueError(f"{exc}; use CIDR networks such as 127.0.0.0/8,::1/128"
                                 ) from exc
        return value

    @field_validator("task_time_limit")
    @classmethod
    def _below_visibility(cls, value: int, info) -> int:
        visibility = info.data.get("visibility_timeout", 3600)
        if value >= visibility:
            raise ValueError(
                f"task_time_limit ({value}s) must be below visibility_timeout ({visibility}s), "
                "or Redis redelivers batches that are still running"
            )
        return value

    def load_deployments(self) -> Deployments:
        return load_deployments(self.deployments_file)

    @property
    def limiter_url(self) -> str | None:
        return self.redis_url or self.broker_url

    def floor_for(self, queue: str) -> float:
        return {QUEUE_REALTIME: self.floor_realtime, QUEUE_STANDARD: self.floor_standard,
                QUEUE_BULK: self.floor_bulk}[queue]

    @property
    def max_countdown_s(self) -> float:
        """The longest a batch may be deferred: well inside Redis's visibility timeout."""
        return max(1.0, self.visibility_timeout - self.task_time_limit - 60)


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    try:
        return Settings()
    except ValidationError as exc:
        raise ConfigError(f"invalid QUOTAFLOW_* setting:\n{exc}") from exc

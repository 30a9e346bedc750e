"""quotaflow's one settings object.

Everything is read from the environment (prefix QUOTAFLOW_) or a .env file;
the deployments file it names (quotaflow/deployments/catalog.py) says which providers
serve which models. API keys are never in either: a deployment names the
environment variable that holds its key, and the key is read only at call time.
"""

import ipaddress
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from limits import parse as parse_rate
from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from quotaflow.constants import QUEUE_BULK, QUEUE_REALTIME, QUEUE_STANDARD
from quotaflow.deployments.catalog import Deployments, load_deployments
from quotaflow.errors import ConfigError
from quotaflow.redis_urls import check_url, is_cluster_url
from quotaflow.settings_renames import RenamedEnvironment, rename_arguments

# Svix's schedule: at once, then 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h (about a day).
WEBHOOK_RETRY_SCHEDULE_S = (0.0, 5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 36000.0)

class Settings(BaseSettings):
    """Every knob of quotaflow, read from QUOTAFLOW_* environment variables."""

    model_config = SettingsConfigDict(env_prefix="QUOTAFLOW_", env_file=".env", extra="ignore")

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings],
                                   init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The usual sources, then former names of renamed settings (settings_renames)."""
        return (init_settings, env_settings, dotenv_settings,
                RenamedEnvironment(settings_cls), file_secret_settings)

    @model_validator(mode="before")
    @classmethod
    def _former_names(cls, data: Any) -> Any:
        return rename_arguments(data)

    database_url: str = Field(
        default="sqlite:///quotaflow.db",
        description="Where jobs, items and results live: PostgreSQL for a cluster "
        "(`postgresql://...`, migrated by `quotaflow db upgrade`); the SQLite default serves "
        "the embedded `quotaflow run`.")
    broker_url: str | None = Field(
        default=None,
        description="Celery's broker, a Redis URL. Unset: no broker, and `quotaflow run` "
        "executes batches in its own process.")
    redis_url: str | None = Field(
        default=None,
        description="The limiter's, circuit breakers' and fair shares' Redis; defaults to "
        "`BROKER_URL`. `redis+cluster://host:port[,host:port...]` (or `rediss+cluster://`) "
        "names a Redis Cluster, whose masters then share the budgets (the broker stays a "
        "plain Redis). With both unset the limiter is in process (the embedded `quotaflow run`).")
    deployments_file: Path | None = Field(
        default=None,
        description="The TOML deployments file: which providers serve which models, their "
        "limits and prices. Unset: everything goes to the built-in simulated mock provider.")
    api_url: str = Field(default="http://127.0.0.1:8000",
                         description="The API the CLI talks to.")
    api_host: str = Field(default="127.0.0.1", description="The address `quotaflow api` binds.")
    api_port: int = Field(default=8000, description="The port `quotaflow api` listens on.")
    api_concurrency: int = Field(
        default=16, ge=1, le=1024,
        description="Requests one API process works on at once (its threads and database "
                    "connections are sized to it); more wait their turn in line. Long-polls "
                    "and event streams wait without taking a place.")
    api_queue_timeout_s: float = Field(
        default=0.5, gt=0, le=30,
        description="How long a request waits in line for a place before the API answers "
                    "503 with Retry-After, rather than letting it wait on a busy server.")
    api_status_cache_s: float = Field(
        default=0.5, ge=0, le=10,
        description="Seconds an API process answers a job's status reads (GET /jobs/{id}, "
                    "GET /v1/batches/{id}) from the object it read last, shared by every "
                    "poller of the job: a change made by a worker or another API process "
                    "shows within this time, one made through the same process at once. "
                    "0 reads the database for every request.")
    api_key_cache_s: float = Field(
        default=5.0, ge=0, le=300,
        description="Seconds an API process remembers which tenant an API key acts for, "
                    "so a status read costs no key lookup; a revoked key stops working "
                    "within this time. 0 looks every key up on every request.")
    api_workers: int = Field(
        default=1, ge=1, le=64,
        description="How many processes `quotaflow api` serves with, all on one port "
        "(each listens with SO_REUSEPORT; a supervisor restarts any that dies). 1: one "
        "process; give the API about one per core it may use (compose runs 2). "
        "`--workers` overrides it.")
    api_rate_limit: str | None = Field(
        default="100/10 seconds",
        description="Requests each API key may make to the API per window, counted in Redis "
        "by every API process together (`limits` notation: `100/10 seconds`, `600/minute`); "
        "a request without a key counts against its client address. Over it: 429 with "
        "`Retry-After`. `off` (or empty): no limit. `/healthz` and `/metrics` are never "
        "limited.")

    batch_size: int = Field(
        default=100, gt=0, le=10_000,
        description="Requests per Celery message at a job's start: small enough that a small "
        "job spreads over many workers, large enough that one message amortises its round "
        "trips (a message, its events, its claim and its report cost a worker about as much "
        "CPU as 25 requests). A job's later batches grow (`LARGEST_BATCH_SIZE`).")
    largest_batch_size: int = Field(
        default=800, gt=0, le=10_000,
        description="The most requests a job's later batches grow to: the batch size doubles "
        "every 16 batches up to this, so a large job pays a message's cost on few of its "
        "requests (docs/scaling.md). Set it to `BATCH_SIZE` to cut every batch alike.")
    max_file_bytes: int = Field(
        default=1024 * 1024 * 1024, gt=0,
        description="The largest file `POST /jobs` (`quotaflow submit`) takes, 1 GiB. Ingest "
        "streams it in constant memory, so this bounds the database's work, not the API's "
        "memory.")
    max_line_bytes: int = Field(
        default=1024 * 1024, gt=0,
        description="The longest input line (one request), 1 MiB: keeps a bad line from "
        "exhausting memory while leaving room for long prompts. Longer lines fail alone.")
    max_lines: int = Field(
        default=2_000_000, gt=0,
        description="Requests per job made through `POST /jobs` (`quotaflow submit`).")
    max_batch_lines: int = Field(
        default=50_000, gt=0,
        description="Requests per batch made through `POST /v1/batches`: OpenAI's 50,000, so "
        "code written for OpenAI meets the limits it expects.")
    max_message_batch_requests: int = Field(
        default=100_000, gt=0,
        description="Requests per Message Batch (`POST /v1/messages/batches`), Anthropic's "
        "limit.")
    max_message_batch_bytes: int = Field(
        default=256 * 1024 * 1024, gt=0,
        description="The largest Message Batch body (`POST /v1/messages/batches`), 256 MiB as "
        "at Anthropic; the body is held whole while its requests are stored. Larger: 413.")

    completion_window_s: int = Field(
        default=24 * 3600, gt=0,
        description="A job's completion window, as OpenAI's \"24h\": then it becomes "
        "`expired` and its unsent requests expire.")
    result_retention_s: int = Field(
        default=30 * 24 * 3600, ge=0,
        description="How long a job's output (its results and its lines' bodies) is kept "
        "after the job ends, for jobs whose submitter set no `output_expires_after`; then the "
        "workers' sweep deletes it and the job stays as a tombstone. 30 days, as OpenAI keeps "
        "batch output. Fixed on each job when it is made, so a change applies to new jobs "
        "only. 0: kept until deleted. The audit log's events (GET /audit) are kept as long "
        "(from when they happened, applying at once to every event).")
    file_retention_s: int = Field(
        default=30 * 24 * 3600, ge=0,
        description="How long an upload (`POST /v1/files`) sent without `expires_after` is "
        "kept: 30 days, OpenAI's default for batch files. 0: kept until deleted.")
    lease_s: int = Field(
        default=30, gt=0,
        description="A claim's lease, renewed every third of it while its batch runs: a lease "
        "that runs out means a dead worker, whose items are free again within this (plus a "
        "reaper round).")
    worker_idle_in_transaction_s: float = Field(
        default=10.0, gt=0,
        description="PostgreSQL ends a worker's transaction that waits this long for the "
        "worker (cut off from the database mid-transaction), so its locks do not stall the "
        "other workers until TCP notices it is gone. Set by the workers only: the API's "
        "output streams may wait for slow clients.")
    reap_interval_s: float = Field(
        default=10.0, gt=0,
        description="How often the workers' reaper looks for expired leases of dead workers "
        "(and sweeps expired output and uploads, at most half of this a round).")
    queue_patience_s: float = Field(
        default=3600.0, gt=0,
        description="How long a pending item may wait for its queue message before the "
        "reaper presumes the message lost (broker restarted empty, dispatch failed) and sends "
        "another. An hour, like Redis's own redelivery: a long queue is not a lost message. A "
        "broker that restarted is noticed at once instead, by its run id.")
    defer_grace_s: float = Field(
        default=30.0, gt=0,
        description="A batch handed back to wait for budget is sent again by the reaper if "
        "its delayed message has not come this long after its countdown (the worker holding "
        "it died, or the broker lost it).")
    provider_max_attempts: int = Field(
        default=5, gt=0, le=20,
        description="Tries per request at the provider, unless a job asks for another number "
        "(`quotaflow submit --max-attempts`, the `max_attempts` form field).")
    max_retry_after_s: float = Field(
        default=60.0, gt=0,
        description="The longest wait a provider's `Retry-After` (or a rate limit's reset) is "
        "believed for, about what the official SDKs allow: a longer one is logged and "
        "clamped; the limiter still protects the budget.")
    dedup: bool = Field(
        default=True,
        description="Identical requests (same endpoint and body) within a job are sent once "
        "and the answer shared where it cannot differ (temperature 0 without sampling, "
        "embeddings, moderations). False: each line is sent unless its job asks otherwise.")
    dedup_across_jobs: bool = Field(
        default=False,
        description="Reuse an earlier job's successful answer to an identical request instead "
        "of calling again: a cache, for requests whose answer cannot differ.")
    visibility_timeout_s: int = Field(
        default=3600, gt=60,
        description="Celery's Redis transport redelivers unacknowledged messages after this "
        "many seconds; `TASK_TIME_LIMIT_S` must stay below it, so a running batch is never "
        "delivered twice.")
    task_time_limit_s: int = Field(
        default=900, gt=0,
        description="The most seconds one batch task may run (Celery's time limit); below "
        "`VISIBILITY_TIMEOUT_S`.")

    floor_realtime: float = Field(
        default=0.0, ge=0, lt=1,
        description="Priority floor of the `realtime` queue: the share of each bucket it must "
        "leave for higher priorities (none: realtime may empty a bucket).")
    floor_standard: float = Field(
        default=0.05, ge=0, lt=1,
        description="Priority floor of the `standard` queue: it stops at this share of each "
        "bucket's capacity, leaving it to `realtime`.")
    floor_bulk: float = Field(
        default=0.20, ge=0, lt=1,
        description="Priority floor of the `bulk` queue: it stops at this share of each "
        "bucket's capacity; bulk alone still gets the whole refill rate.")
    admission_order: Literal["mixed", "fifo"] = Field(
        default="mixed",
        description="The order a job's batches are queued in: `mixed` spends RPM and TPM "
        "together by interleaving light and heavy batches at the job's own mix; `fifo` keeps "
        "line order.")
    max_inline_wait_s: float = Field(
        default=5.0, ge=0,
        description="A batch told to wait longer than this for budget goes back to the queue "
        "with that countdown instead of holding a worker.")
    fair_share: bool = Field(
        default=True,
        description="Share each deployment's budget between tenants with work by their "
        "weights; false: whoever's batches come first take it all.")

    worker_deployment: str | None = Field(
        default=None,
        description="Set by `quotaflow worker --deployment NAME`: the one local deployment "
        "whose model this worker process loads. A worker without it loads no model at all.")
    worker_realtime_slots: int = Field(
        default=1, ge=0, le=64,
        description="Threads a `quotaflow worker` that consumes `realtime` beside other "
        "queues keeps for realtime batches alone (a small second Celery worker beside its "
        "pool), so a realtime job never waits for a slot behind bulk batches. 0: every slot "
        "takes any queue (realtime then waits behind a bulk flood). "
        "`quotaflow worker --realtime-slots` overrides it.")
    worker_metrics_port: int | None = Field(
        default=None, gt=0, lt=65536,
        description="Set by `quotaflow worker --metrics-port PORT`: the worker's main process "
        "serves its pool's Prometheus metrics there. Unset: no metrics server.")

    metrics_token: SecretStr | None = Field(
        default=None,
        description="When set, the API's `/metrics` and each worker's metrics port answer "
        "only requests with `Authorization: Bearer <token>` (Prometheus's `authorization` "
        "scrape setting; others get 401): the metrics name deployments and tenants. From "
        "the environment only, never logged. Unset: open, like most exporters.")
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="Log lines as plain text (with the job id and other context as "
        "`key=value`) or as one JSON object each, for workers, the API and the CLI.")

    flower_basic_auth: str | None = Field(
        default=None,
        description="`user:password` (several separated by commas) for Flower; `quotaflow "
        "flower` refuses to start without it unless given `--no-auth` (Flower's own "
        "`FLOWER_BASIC_AUTH` counts too).")
    flower_port: int = Field(default=5555, description="The port `quotaflow flower` serves on.")
    flower_url: str | None = Field(
        default=None,
        description="Flower's address as operators reach it (e.g. `http://ops.example:5555`): "
        "the console's budgets page links to it. Unset: no link.")
    grafana_url: str | None = Field(
        default=None,
        description="Grafana's address as operators reach it (e.g. `http://ops.example:3000`): "
        "the console's budgets page links to it. Unset: no link.")

    auth: bool = Field(
        default=True,
        description="API keys and tenants. Off (`off`, for development only): every request "
        "is served as the tenant `default`.")
    api_key: SecretStr | None = Field(
        default=None,
        description="The key the CLI sends as `Authorization: Bearer ...`; read from the "
        "environment only, never logged.")
    watch_interval_s: float = Field(
        default=0.5, gt=0, le=10,
        description="How often an API process reads a job that long-polls (`GET "
        "/jobs/{id}?wait=N`) and event streams (`GET /jobs/{id}/events`) wait on: one read "
        "per job per process per interval, however many clients wait, and none while none do.")
    events_keepalive_s: float = Field(
        default=15.0, gt=0, le=300,
        description="How often an idle event stream (`GET /jobs/{id}/events`) sends a comment, "
        "so that proxies and load balancers do not close it for silence.")
    progress_interval_s: float = Field(
        default=5.0, gt=0,
        description="How often `quotaflow run` and `quotaflow status --watch` write a "
        "progress line (done/total, rate, ETA) when standard error is not a terminal (CI "
        "logs, `| tee`, `nohup`); on a terminal they draw a bar instead.")
    submit_timeout_s: float = Field(
        default=1800.0, gt=0,
        description="How long `quotaflow submit` waits for the API's answer to an upload (the "
        "API stores the whole file before it answers) before it sends it again with the same "
        "`Idempotency-Key`; a busy API is never taken for an unreachable one.")
    max_upload_bytes: int = Field(
        default=200 * 1024 * 1024, gt=0,
        description="`POST /v1/files` refuses larger uploads (413) while they stream: "
        "OpenAI's limit, 200 MB.")
    max_enqueued_tokens: int | None = Field(
        default=None, gt=0,
        description="Prompt tokens one tenant's unfinished batches may hold, like OpenAI's "
        "enqueued-token limit; a tenant's own limit (`quotaflow keys create "
        "--max-enqueued-tokens`) overrides it. Unset: no limit.")
    max_monthly_spend: float | None = Field(
        default=None, ge=0,
        description="What one tenant may spend per calendar month (UTC), in the deployments' "
        "currency, at their prices; a tenant's own limit (`quotaflow keys create "
        "--max-spend`) overrides it. Unset: no limit.")

    webhook_secret_key: SecretStr | None = Field(
        default=None,
        description="The master key each webhook endpoint's signing secret is derived from "
        "(HMAC-SHA256 of the endpoint id; 32 or more random characters), the same on the API "
        "and every worker. Secrets are never stored, so without it no endpoint can be created "
        "and no event signed. Changing it changes every secret.")
    webhook_delivery: bool = Field(
        default=True,
        description="Whether this worker delivers webhooks (a thread of its main process).")
    webhook_retry_schedule_s: Annotated[tuple[float, ...], NoDecode] = Field(
        default=WEBHOOK_RETRY_SCHEDULE_S,
        description="Seconds before each attempt of a delivery, comma-separated: the first is "
        "after the job's end, each next one after the previous failure; after the last, the "
        "delivery has failed. Svix's schedule: about 27 hours in all.")
    webhook_timeout_s: float = Field(
        default=10.0, gt=0, le=120,
        description="How long one delivery attempt may take (connect, send, answer), as "
        "Svix's 15 s roughly.")
    webhook_poll_interval_s: float = Field(
        default=1.0, gt=0,
        description="How often the delivery loop looks for ended jobs and due deliveries.")
    webhook_allowed_networks: Annotated[tuple[ipaddress.IPv4Network | ipaddress.IPv6Network,
                                              ...], NoDecode] = Field(
        default=(),
        description="Networks webhook endpoints may reach although they are loopback, "
        "private, link-local, unspecified or multicast (the server-side request forgery "
        "guard), comma-separated: `127.0.0.0/8,10.1.0.0/16`.")

    provider_batch_loop: bool = Field(
        default=True,
        description="Whether this worker runs the provider batch loop (a thread of its main "
        "process) that groups bulk jobs' lines into provider batches, uploads and polls them.")
    provider_batch_gather_s: float = Field(
        default=60.0, ge=0,
        description="How long a line waits for more to join its provider batch before a "
        "batch that is not full is uploaded.")
    provider_batch_poll_s: float = Field(
        default=30.0, gt=0, description="How often a provider batch is polled.")
    provider_batch_lease_s: float = Field(
        default=300.0, gt=0,
        description="How long a worker's claim of a provider batch lasts: a dead worker's "
        "lapses, and another worker resumes it.")
    provider_batch_window_margin_s: float = Field(
        default=3600.0, ge=0,
        description="How long before a job's `expires_at` its lines not yet answered by a "
        "provider batch move to realtime deployments.")

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

    @field_validator("api_rate_limit")
    @classmethod
    def _rate_limit(cls, value: str | None) -> str | None:
        if value is None or value.strip().lower() in ("", "off", "none", "0"):
            return None
        try:
            item = parse_rate(value)
        except ValueError as exc:
            raise ValueError(f"{value!r} is not a rate: write it as 100/10 seconds, "
                             "600/minute or off") from exc
        if item.amount < 1:
            raise ValueError("a rate limit allows at least one request per window (or: off)")
        return value

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        return check_url(value) if value else None  # empty: unset, the broker's

    @field_validator("broker_url")
    @classmethod
    def _plain_broker(cls, value: str | None) -> str | None:
        if value is not None and is_cluster_url(value):
            raise ValueError("Celery's broker must be one Redis, not a Redis Cluster: name the "
                             "cluster in QUOTAFLOW_REDIS_URL and a plain redis:// here")
        return value

    @field_validator("metrics_token", mode="before")
    @classmethod
    def _token_or_none(cls, value: object) -> object:
        """An empty variable (compose's `${QUOTAFLOW_METRICS_TOKEN:-}`) means no token, not
        the empty token."""
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @field_validator("task_time_limit_s")
    @classmethod
    def _below_visibility(cls, value: int, info: ValidationInfo) -> int:
        visibility = info.data.get("visibility_timeout_s", 3600)
        if value >= visibility:
            raise ValueError(
                f"task_time_limit_s ({value}s) must be below visibility_timeout_s "
                f"({visibility}s), "
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
    def task_soft_time_limit(self) -> int:
        """Celery's soft limit, 30 s before the hard one: the batch's last chance to end
        cleanly (a batch hands its unsent lines back at half of it, execution/admission.py)."""
        return max(1, self.task_time_limit_s - 30)

    @property
    def max_countdown_s(self) -> float:
        """The longest a batch may be deferred: well inside Redis's visibility timeout."""
        return max(1.0, self.visibility_timeout_s - self.task_time_limit_s - 60)


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    try:
        return Settings()
    except ValidationError as exc:
        # Each variable and why, not its value: a URL may hold a password.
        problems = "\n".join(
            f"QUOTAFLOW_{'_'.join(map(str, error['loc'])).upper()}: {error['msg']}"
            for error in exc.errors(include_url=False, include_input=False))
        raise ConfigError(f"invalid QUOTAFLOW_* setting:\n{problems}") from exc

"""quotaflow's job object (GET /jobs/{id} and the other /jobs routes), its list page, its
retry and the answers of `dry_run` and /bound."""

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from api.schemas.common import Answer, Number, OpenAIList
from quotaflow.models import JobStatus

if TYPE_CHECKING:  # a Literal made of the statuses at run time; a str to the checker
    Status = str
else:
    Status = Literal[JobStatus.ACTIVE + JobStatus.FINAL]


class RequestCounts(Answer):
    total: int
    completed: int
    failed: int = Field(description="Failed at the provider, or stopped by a spend limit")
    pending: int
    cancelled: int
    expired: int


class Usage(Answer):
    input_tokens: int
    output_tokens: int
    total_tokens: int


class Cost(Answer):
    """What the job's calls cost so far at the deployments' prices."""

    currency: str | None
    total: Number
    complete: bool = Field(description="false: a deployment without prices is left out")
    by_deployment: dict[str, Number | None]


class Job(Answer):
    """A job, as OpenAI describes a batch, plus quotaflow's fields."""

    id: str
    object: Literal["batch"]
    endpoint: str | None
    status: Status
    queue: str
    input_filename: str | None
    request_counts: RequestCounts
    usage: Usage
    cost: Cost
    stop_reason: str | None
    output_format: Literal["openai", "anthropic"] | None
    metadata: dict[str, str] | None
    max_attempts: int | None
    created_at: int | None
    in_progress_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    expired_at: int | None
    expires_at: int | None
    output_expires_at: int | None = Field(
        description="When the results go (null: kept, or the job still runs)")
    deleted: bool
    deleted_at: int | None


class RetriedJob(Job):
    retried: int = Field(description="Requests queued again")


class JobList(OpenAIList[Job]):
    """A page of the tenant's jobs, newest first."""


class LineError(Answer):
    line: int
    message: str


class EstimateLines(Answer):
    total: int
    valid: int
    invalid: int
    errors: list[LineError]


class Estimate(Answer):
    """POST /jobs?dry_run=true: the file's tokens, cost and time, nothing stored
    (docs/formats/estimate.md)."""

    object: Literal["estimate"]
    queue: str
    endpoint: str | None
    lines: EstimateLines
    routes: list[dict[str, Any]]
    totals: dict[str, Any]
    tenant: dict[str, Any] | None
    submit_would_refuse: list[str]


class JobBound(Answer):
    """What bound the job: seconds of its time per cause, the top one and the advice."""

    object: Literal["job.bound"]
    id: str
    cause: str | None
    deployment: str | None
    dimension: str | None
    advice: str
    seconds: dict[str, Number]
    shares: dict[str, Number]
    summary: str

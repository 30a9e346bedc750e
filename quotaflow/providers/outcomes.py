"""What became of one request: an answer, a failure with its code, or a shared answer.

The failure codes are an enum, not free strings, because they are a contract:
error files, the job's counts and (later) metrics and alerts key on them.
"""

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from quotaflow.providers.base import ProviderResponse


class FailureCode(StrEnum):
    """The `error.code` of a line that got no answer."""

    # The line itself is not a request quotaflow can send (refused at ingest).
    INVALID_REQUEST = "invalid_request"
    # No route names a deployment for the line's model.
    NO_DEPLOYMENT = "no_deployment"
    # The deployment cannot be called as configured (e.g. its key is not set).
    CONFIGURATION_ERROR = "configuration_error"
    # The deployments its route names cannot serve its endpoint (providers/capabilities.py).
    UNSUPPORTED_ENDPOINT = "unsupported_endpoint"
    # The request needs more tokens than the deployment's bucket can ever hold.
    REQUEST_TOO_LARGE = "request_too_large"
    # The provider refused it, or kept failing until the attempts ran out.
    PROVIDER_ERROR = "provider_error"
    # Never sent: the job was cancelled, or its completion window ended.
    BATCH_CANCELLED = "batch_cancelled"
    BATCH_EXPIRED = "batch_expired"
    # Never sent: the tenant reached its monthly spend limit (quotaflow/tenants/spend.py).
    SPEND_LIMIT_EXCEEDED = "spend_limit_exceeded"
    # Refused at ingest: its key or tenant may not use the model (quotaflow/tenants/grants.py).
    MODEL_NOT_ALLOWED = "model_not_allowed"


# A line that was never sent, by its item's status (models.ItemStatus): its error
# line's code, and why.
UNSENT_CODES = {"cancelled": FailureCode.BATCH_CANCELLED, "expired": FailureCode.BATCH_EXPIRED,
                "spend_limited": FailureCode.SPEND_LIMIT_EXCEEDED}
NOT_SENT_BECAUSE = {"cancelled": "the job was cancelled", "expired": "the job expired",
                    "spend_limited": "its tenant reached its monthly spend limit"}


@dataclass(frozen=True)
class Failure:
    """Why an item failed, as its error line will say."""

    code: FailureCode
    message: str
    status_code: int | None = None
    body: dict[str, Any] | None = None
    attempts: int | None = None  # provider calls made, where any were


@dataclass(frozen=True)
class Shared:
    """The answer an identical request got in an earlier job, reused instead of a call."""

    status_code: int | None
    body: dict[str, Any] | None
    source: dict[str, Any]  # {"id", "custom_id", "batch_id"} of the call that was made


Outcome = ProviderResponse | Failure | Shared


@dataclass(slots=True)  # not frozen: one is made per call, and nothing changes it
class Provenance:
    """Where and how an outcome was got: the deployment of its last call, the calls made,
    and when that call was admitted, sent and answered (wall-clock seconds since the
    epoch). Stored with the result, so a line can be traced and a job's report drawn."""

    deployment: str
    attempts: int
    admitted_at: float
    sent_at: float
    answered_at: float

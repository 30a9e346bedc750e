"""A deployment's limits and how full its buckets are (GET /limits, operator keys)."""

from typing import Literal

from pydantic import Field

from api.schemas.common import Answer, Number


class DeploymentLimits(Answer):
    """quotaflow.budget.limiter.describe; the input bucket's two fields only where the
    deployment has separate input and output limits (answered without unset fields)."""

    deployment: str
    provider: str
    model: str
    rpm: int | None
    tpm: int | None
    itpm: int | None
    otpm: int | None
    burst_seconds: Number
    requests_available: Number
    tokens_available: Number
    request_capacity: Number
    token_capacity: Number
    input_tokens_available: Number | None = None
    input_capacity: Number | None = None
    blocked_for_s: Number
    reconcile_usage: bool | Literal["auto"] = Field(
        description="auto: reconciled where the provider reports usage")
    refunds_unused_tokens: bool
    utilisation: Number


class LimitsList(Answer):
    object: Literal["list"]
    data: list[DeploymentLimits]

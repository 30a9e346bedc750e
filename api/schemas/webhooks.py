"""Webhook endpoints and their deliveries."""

from typing import Generic, Literal, TypeVar

from pydantic import Field

from api.schemas.common import Answer, Number


class WebhookEndpoint(Answer):
    id: str
    object: Literal["webhook_endpoint"]
    url: str
    events: list[str]
    created_at: int


class CreatedWebhookEndpoint(WebhookEndpoint):
    secret: str = Field(description="The signing secret (`whsec_...`), shown this once")


class Attempt(Answer):
    attempt: int
    attempted_at: Number
    status_code: int | None
    error: str | None
    duration_ms: int | None


class WebhookDelivery(Answer):
    id: str
    object: Literal["webhook_delivery"]
    endpoint_id: str
    event_id: str
    type: str
    job_id: str
    status: str
    created_at: int
    delivered_at: int | None
    next_attempt_at: int | None
    attempts: list[Attempt]


Item = TypeVar("Item")


class WebhookList(Answer, Generic[Item]):
    """Endpoints or deliveries, as a list object."""

    object: Literal["list"]
    data: list[Item]
    has_more: bool


class EndpointList(WebhookList[WebhookEndpoint]):
    """The tenant's webhook endpoints."""


class DeliveryList(WebhookList[WebhookDelivery]):
    """The newest deliveries, each with its attempts."""

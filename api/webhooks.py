"""Webhook endpoints and their deliveries, for the tenant of the request's API key.

POST /webhooks answers the endpoint's signing secret, this once; no other answer holds
it. Bad input (an unknown event, a URL quotaflow does not send to) is a 400 naming the
parameter and the reason; a server without QUOTAFLOW_WEBHOOK_SECRET_KEY answers 503.
"""

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from api.deps import (
    ID_PATTERN,
    ActorDep,
    IdPath,
    SessionDep,
    SessionsDep,
    SettingsDep,
    TenantDep,
)
from api.errors import responses
from api.schemas.common import Deleted
from api.schemas.webhooks import (
    CreatedWebhookEndpoint,
    DeliveryList,
    EndpointList,
    WebhookEndpoint,
)
from quotaflow.webhooks import EVENT_TYPES, endpoints
from quotaflow.webhooks.guard import MAX_URL_CHARS

router = APIRouter(tags=["webhooks"])


class EndpointRequest(BaseModel):
    # The host must resolve to addresses quotaflow may send to (public ones, or those of
    # QUOTAFLOW_WEBHOOK_ALLOWED_NETWORKS): checked when the endpoint is made.
    url: str = Field(description="http(s) URL that receives the events (POST); its host "
                                 "must resolve to a public address or an allowed network",
                     json_schema_extra={"format": "uri", "maxLength": MAX_URL_CHARS,
                                        "pattern": r"^[Hh][Tt][Tt][Pp][Ss]?://[!-~]+$"})
    events: list[str] | None = Field(
        default=None, description=f"Events to receive, of {', '.join(EVENT_TYPES)} (default: all)",
        json_schema_extra={"minItems": 1, "items": {"enum": list(EVENT_TYPES)}})


def _list(data: list[dict[str, Any]], has_more: bool = False) -> dict[str, Any]:
    return {"object": "list", "data": data, "has_more": has_more}


@router.post("/webhooks", status_code=201, response_model=CreatedWebhookEndpoint,
             responses=responses(400, 401))
def create_webhook(body: EndpointRequest, sessions: SessionsDep, settings: SettingsDep,
                   tenant: TenantDep, actor: ActorDep) -> dict[str, Any]:
    """Register an endpoint; the answer's `secret` (`whsec_...`) is shown this once."""
    endpoint, secret = endpoints.create_endpoint(sessions, settings, tenant, body.url,
                                                 body.events, actor)
    return {**endpoints.endpoint_object(endpoint), "secret": secret}


@router.get("/webhooks", response_model=EndpointList, responses=responses(401))
def list_webhooks(session: SessionDep, tenant: TenantDep) -> dict[str, Any]:
    return _list([endpoints.endpoint_object(e) for e in endpoints.list_endpoints(session, tenant)])


@router.get("/webhooks/deliveries", response_model=DeliveryList,
            responses=responses(401, 404))
def list_all_deliveries(
        session: SessionDep, tenant: TenantDep,
        endpoint: Annotated[str | None, Query(pattern=ID_PATTERN,
                                              description="Only this endpoint's")] = None,
        limit: Annotated[int, Query(ge=1, le=100)] = 20) -> dict[str, Any]:
    """The newest deliveries, each with every attempt (time, status code or error, ms)."""
    rows = endpoints.list_deliveries(session, tenant, endpoint, limit + 1)
    return _list(rows[:limit], len(rows) > limit)


@router.get("/webhooks/{endpoint_id}", response_model=WebhookEndpoint,
            responses=responses(401, 404))
def get_webhook(endpoint_id: IdPath, session: SessionDep, tenant: TenantDep) -> dict[str, Any]:
    return endpoints.endpoint_object(endpoints.get_endpoint(session, endpoint_id, tenant))


@router.delete("/webhooks/{endpoint_id}", response_model=Deleted, responses=responses(401, 404))
def delete_webhook(endpoint_id: IdPath, sessions: SessionsDep,
                   tenant: TenantDep, actor: ActorDep) -> dict[str, Any]:
    """Remove the endpoint; its deliveries not yet made are dropped."""
    endpoints.remove_endpoint(sessions, endpoint_id, tenant, actor)
    return {"id": endpoint_id, "object": "webhook_endpoint", "deleted": True}


@router.get("/webhooks/{endpoint_id}/deliveries",
            response_model=DeliveryList, responses=responses(401, 404))
def list_deliveries(endpoint_id: IdPath, session: SessionDep, tenant: TenantDep,
                    limit: Annotated[int, Query(ge=1, le=100)] = 20) -> dict[str, Any]:
    rows = endpoints.list_deliveries(session, tenant, endpoint_id, limit + 1)
    return _list(rows[:limit], len(rows) > limit)

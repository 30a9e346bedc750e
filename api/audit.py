"""GET /audit: who created, cancelled, retried or deleted what (quotaflow/tenants/audit.py).

An admin key's (api/scopes.py); an operator's key sees every tenant's events, or one
tenant's with `tenant`, any other key its own tenant's only.
"""

from typing import Annotated, Any

from fastapi import APIRouter, Query

from api.deps import GrantDep, SessionDep
from api.errors import responses
from api.schemas.audit import AuditList
from quotaflow.errors import PermissionDenied
from quotaflow.tenants import audit

router = APIRouter(tags=["audit"])
# Event ids are PostgreSQL bigints: a larger `before` would be the database's error.
MAX_ID = 2**63 - 1


@router.get("/audit", response_model=AuditList, responses=responses(401, 403))
def audit_log(session: SessionDep, grant: GrantDep,
              tenant: Annotated[str | None, Query(
                  max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
                  description="Only this tenant's (operator keys; others see their own)")
              ] = None,
              before: Annotated[int | None, Query(
                  ge=1, le=MAX_ID,
                  description="Id of the last event of the previous page")] = None,
              limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> dict[str, Any]:
    """The newest events first: key, tenant, action, object, time and client address."""
    if not grant.operator:
        if tenant not in (None, grant.tenant):
            raise PermissionDenied("another tenant's audit log needs an operator key; "
                                   "`quotaflow keys create --tenant NAME --operator` makes one")
        tenant = grant.tenant
    rows = audit.events(session, tenant=tenant, limit=limit + 1, before=before)
    return {"object": "list", "data": [audit.event_object(r) for r in rows[:limit]],
            "has_more": len(rows) > limit}

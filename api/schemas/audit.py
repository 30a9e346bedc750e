"""The audit log's answer: one event per action, newest first."""

from typing import Literal

from api.schemas.common import Answer


class AuditEvent(Answer):
    """Who (key, tenant, client address) did what (action, object) and when (Unix time)."""

    id: int
    object: Literal["audit_event"]
    at: int
    tenant: str
    key_id: str | None
    action: str
    object_type: str
    object_id: str
    client: str | None


class AuditList(Answer):
    """A page of events; `before` (the last id) asks for the next, older, one."""

    object: Literal["list"]
    data: list[AuditEvent]
    has_more: bool

"""Anthropic's Message Batch (anthropic.types.messages.MessageBatch) and its list page.

Times are written as quotaflow.compat.anthropic_batches writes them (RFC 3339, UTC, to
the microsecond), also where pydantic would drop a zero fraction."""

from datetime import datetime

from anthropic.types.messages import DeletedMessageBatch
from anthropic.types.messages import MessageBatch as SDKMessageBatch
from pydantic import field_serializer

from api.schemas.common import AnthropicList
from quotaflow.compat.anthropic_batches import rfc3339


class MessageBatch(SDKMessageBatch):
    @field_serializer("archived_at", "cancel_initiated_at", "created_at", "ended_at",
                      "expires_at", when_used="json")
    def _rfc3339(self, moment: datetime | None) -> str | None:
        return rfc3339(moment)


class MessageBatchList(AnthropicList[MessageBatch]):
    """A page of the tenant's Message Batches, newest first."""

__all__ = ["DeletedMessageBatch", "MessageBatch", "MessageBatchList"]

"""The strict provider's Anthropic Message Batches: create, retrieve, list, cancel, results.

Requests are answered the way /v1/messages answers them (messages.py: the same checks
and the same simulated Message), but not under the per-minute limits: Anthropic counts
batches against limits of their own. A batch is `in_progress` for `batch_seconds`, then
`ended` with its results as a JSONL stream at results_url; cancelled before that, it
ends at once with its requests `canceled`. A request whose text holds "[mock:expire]"
ends `expired`, and one with "[mock:error]" `errored` (api_error, which another
deployment may answer), so that tests can drive both.
"""

import hmac
import json
import re
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from mock_provider.messages import error_response, invalid, prompt_of, simulated_message
from quotaflow.budget.tokens import estimate_tokens

CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_REQUESTS = 100_000
EXPIRE, ERROR = "[mock:expire]", "[mock:error]"


@dataclass
class MessageBatch:
    id: str
    requests: list[dict[str, Any]]
    created: float
    ready_at: float
    cancelled_at: float | None = None
    results: list[dict[str, Any]] | None = None
    ended: float | None = None
    downloads: int = field(default=0)

    def advance(self, now: float) -> None:
        """End the batch once its time has come (or at once after a cancel)."""
        if self.results is not None:
            return
        if self.cancelled_at is not None:
            self.results = [{"custom_id": r["custom_id"], "result": {"type": "canceled"}}
                            for r in self.requests]
        elif now >= self.ready_at:
            self.results = [{"custom_id": r["custom_id"], "result": _answer(r["params"])}
                            for r in self.requests]
        else:
            return
        self.ended = now

    def as_json(self, base: str) -> dict[str, Any]:
        counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
        if self.results is None:
            counts["processing"] = len(self.requests)
            status = "canceling" if self.cancelled_at else "in_progress"
        else:
            for line in self.results:
                counts[line["result"]["type"]] += 1
            status = "ended"
        return {"id": self.id, "type": "message_batch", "processing_status": status,
                "request_counts": counts, "created_at": _iso(self.created),
                "expires_at": _iso(self.created + 86400),
                "ended_at": _iso(self.ended) if self.ended else None,
                "cancel_initiated_at": _iso(self.cancelled_at) if self.cancelled_at else None,
                "archived_at": None,
                "results_url": (f"{base}/v1/messages/batches/{self.id}/results"
                                if self.results is not None else None)}


def _answer(params: Any) -> dict[str, Any]:
    reason = invalid(params)
    if reason is not None:
        return {"type": "errored", "error": {"type": "error", "error": {
            "type": "invalid_request_error", "message": reason}}}
    text = prompt_of(params)
    if EXPIRE in text:
        return {"type": "expired"}
    if ERROR in text:
        return {"type": "errored", "error": {"type": "error", "error": {
            "type": "api_error", "message": "Internal server error (simulated)"}}}
    return {"type": "succeeded", "message": simulated_message(params, estimate_tokens(text))}


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat().replace("+00:00", "Z")


class MessageBatches:
    """The /v1/messages/batches routes of one strict app, and the batches made there."""

    def __init__(self, api_key: str | None, batch_seconds: float) -> None:
        self.api_key, self.batch_seconds = api_key, batch_seconds
        self.batches: dict[str, MessageBatch] = {}

    def mount(self, app: FastAPI) -> None:
        app.state.message_batches = self.batches
        route = app.add_api_route
        route("/v1/messages/batches", self.create, methods=["POST"])
        route("/v1/messages/batches", self.list, methods=["GET"])
        route("/v1/messages/batches/{batch_id}", self.retrieve, methods=["GET"])
        route("/v1/messages/batches/{batch_id}/cancel", self.cancel, methods=["POST"])
        route("/v1/messages/batches/{batch_id}/results", self.results, methods=["GET"])

    def _refused(self, request: Request) -> Response | None:
        # x-api-key, as Anthropic documents it; the official SDK now sends its api_key
        # as a bearer token.
        given = request.headers.get("x-api-key") or request.headers.get(
            "authorization", "").removeprefix("Bearer ")
        if self.api_key is not None and not hmac.compare_digest(given.encode(),
                                                                self.api_key.encode()):
            return error_response(401, "authentication_error", "invalid x-api-key")
        return None

    def _found(self, batch_id: str, request: Request) -> MessageBatch | Response:
        if (no := self._refused(request)) is not None:
            return no
        batch = self.batches.get(batch_id)
        if batch is None:
            return error_response(404, "not_found_error", f"no message batch {batch_id}")
        batch.advance(time.time())
        return batch

    async def create(self, request: Request) -> Response:
        if (no := self._refused(request)) is not None:
            return no
        try:
            requests = json.loads(await request.body()).get("requests")
        except (ValueError, AttributeError):
            requests = None
        if not isinstance(requests, list) or not 0 < len(requests) <= MAX_REQUESTS:
            return error_response(400, "invalid_request_error",
                                  f"requests: 1 to {MAX_REQUESTS} requests are required")
        ids = [r.get("custom_id") if isinstance(r, dict) else None for r in requests]
        if not all(isinstance(i, str) and CUSTOM_ID.match(i) for i in ids) \
                or len(set(ids)) != len(ids):
            return error_response(400, "invalid_request_error", "requests: each custom_id must "
                                  "match ^[a-zA-Z0-9_-]{1,64}$ and be unique in the batch")
        now = time.time()
        batch = MessageBatch(f"msgbatch_{uuid.uuid4().hex[:24]}", requests, now,
                             now + self.batch_seconds)
        self.batches[batch.id] = batch
        return JSONResponse(batch.as_json(_base(request)))

    async def list(self, request: Request) -> Response:
        if (no := self._refused(request)) is not None:
            return no
        data = [b.as_json(_base(request)) for b in reversed(self.batches.values())]
        return JSONResponse({"data": data, "has_more": False,
                             "first_id": data[0]["id"] if data else None,
                             "last_id": data[-1]["id"] if data else None})

    async def retrieve(self, batch_id: str, request: Request) -> Response:
        batch = self._found(batch_id, request)
        if isinstance(batch, Response):
            return batch
        return JSONResponse(batch.as_json(_base(request)))

    async def cancel(self, batch_id: str, request: Request) -> Response:
        batch = self._found(batch_id, request)
        if isinstance(batch, Response):
            return batch
        if batch.results is None and batch.cancelled_at is None:
            batch.cancelled_at = time.time()
        return JSONResponse(batch.as_json(_base(request)))

    async def results(self, batch_id: str, request: Request) -> Response:
        batch = self._found(batch_id, request)
        if isinstance(batch, Response):
            return batch
        if batch.results is None:
            return error_response(400, "invalid_request_error",
                                  f"message batch {batch_id} has not ended yet")
        batch.downloads += 1
        body = "".join(json.dumps(line) + "\n" for line in batch.results)
        return Response(body, media_type="application/binary")


def _base(request: Request) -> str:
    return str(request.base_url).rstrip("/")

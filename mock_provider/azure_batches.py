"""The strict provider's Azure OpenAI Batch API: files and batches under /openai/.

Routes, as Azure OpenAI serves a global-batch deployment's jobs (every one with
`?api-version=V`, V the server's, and Azure's auth: `api-key` or an Entra token the
server's identity endpoint issued, azure.py):

- POST /openai/files (multipart: `purpose=batch` and the JSONL `file`), each line
  `{"custom_id", "method": "POST", "url": "/chat/completions", "body": {"model": ...}}`
  with unique custom_ids, else Azure's 400 naming the line;
- POST /openai/batches `{"input_file_id", "endpoint": "/chat/completions",
  "completion_window": "24h", "metadata"?}`; GET /openai/batches (newest first, `limit`
  and `after`), GET /openai/batches/{id}, POST /openai/batches/{id}/cancel;
- GET /openai/files/{id}/content: a batch's output file, one line per request:
  `{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`.

A batch is `in_progress` for `batch_seconds`, then `completed`, its answers the OpenAI
routes' (chat_problem's 400s included), with Azure's content filter results. Cancelled
before then, it is `cancelled` with no output. Batches are counted against no
per-minute limit: Azure gives batch deployments an enqueued-token quota instead.
"""

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from mock_provider.azure import AzureWire
from mock_provider.shapes import chat_problem
from quotaflow.constants import ENDPOINT_CHAT
from quotaflow.providers.mock import simulated_body

AZURE_URL = "/chat/completions"
_FILTERED_NOTHING = {kind: {"filtered": False, "severity": "safe"}
                     for kind in ("hate", "self_harm", "sexual", "violence")}


@dataclass
class AzureBatch:
    id: str
    input_file_id: str
    metadata: dict[str, str] | None
    created: float
    ready_at: float
    lines: list[dict[str, Any]]
    status: str = "in_progress"
    output_file_id: str | None = None

    def as_json(self) -> dict[str, Any]:
        done = self.status == "completed"
        return {"id": self.id, "object": "batch", "endpoint": AZURE_URL, "errors": None,
                "input_file_id": self.input_file_id, "completion_window": "24h",
                "status": self.status, "output_file_id": self.output_file_id,
                "error_file_id": None, "created_at": int(self.created),
                "metadata": self.metadata, "request_counts": {
                    "total": len(self.lines), "completed": len(self.lines) if done else 0,
                    "failed": 0}}


def _answer(line: dict[str, Any]) -> dict[str, Any]:
    body = line["body"]
    request_id = str(uuid.uuid4())
    problem = chat_problem(body)
    if problem is not None:
        response = {"status_code": 400, "request_id": request_id, "body": {"error": {
            "code": "BadRequest", "message": problem}}}
    else:
        answer = simulated_body(ENDPOINT_CHAT, body)
        answer["prompt_filter_results"] = [
            {"prompt_index": 0, "content_filter_results": _FILTERED_NOTHING}]
        response = {"status_code": 200, "request_id": request_id, "body": answer}
    return {"id": f"response-{uuid.uuid4().hex[:12]}", "custom_id": line["custom_id"],
            "response": response, "error": None}


class AzureBatches:
    """Files and batches of Azure's Batch API; `wire` (azure.AzureWire) judges auth."""

    def __init__(self, wire: AzureWire, batch_seconds: float) -> None:
        self.wire, self.batch_seconds = wire, batch_seconds
        self.files: dict[str, bytes] = {}
        self.inputs: dict[str, list[dict[str, Any]]] = {}
        self.batches: dict[str, AzureBatch] = {}

    def mount(self, app: FastAPI) -> None:
        app.add_api_route("/openai/files", self.upload, methods=["POST"])
        app.add_api_route("/openai/files/{file_id}/content", self.content, methods=["GET"])
        app.add_api_route("/openai/batches", self.create, methods=["POST"])
        app.add_api_route("/openai/batches", self.listing, methods=["GET"])
        app.add_api_route("/openai/batches/{batch_id}", self.retrieve, methods=["GET"])
        app.add_api_route("/openai/batches/{batch_id}/cancel", self.cancel, methods=["POST"])

    def _refused(self, request: Request) -> Response | None:
        """Azure's refusal of a request with the wrong api-version or auth, or None."""
        if request.query_params.get("api-version") != self.wire.api_version:
            return self.wire._refused("batch-api-version", 400, "BadRequest",
                                      "API version not supported")
        if not self.wire.authorized(request):
            return self.wire.unauthorized()
        return None

    async def upload(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        form = await request.form()
        upload = form.get("file")
        if form.get("purpose") != "batch" or upload is None or isinstance(upload, str):
            return _bad("a batch file needs purpose=batch and a file part")
        data = await upload.read()
        lines, seen = [], set()
        for n, raw in enumerate(data.splitlines(), start=1):
            if not raw.strip():
                continue
            line = json.loads(raw)
            if (line.get("method") != "POST" or line.get("url") != AZURE_URL
                    or not isinstance(line.get("body"), dict)
                    or not isinstance(line["body"].get("model"), str)
                    or line.get("custom_id") in seen):
                return _bad(f"line {n}: each line needs a unique custom_id, method POST, url "
                            f"{AZURE_URL} and a body naming the deployment as model")
            seen.add(line["custom_id"])
            lines.append(line)
        file_id = f"file-{uuid.uuid4().hex}"
        self.inputs[file_id] = lines
        self.wire.seen["batch-files"] += 1
        return JSONResponse({"id": file_id, "object": "file", "purpose": "batch",
                             "filename": getattr(upload, "filename", "input.jsonl"),
                             "bytes": len(data), "created_at": int(time.time()),
                             "status": "processed"})

    async def create(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        body = await request.json()
        lines = self.inputs.get(body.get("input_file_id"))
        if lines is None:
            return _bad("input_file_id: no such file", 404)
        if body.get("endpoint") != AZURE_URL or body.get("completion_window") != "24h":
            return _bad(f"endpoint must be {AZURE_URL} and completion_window 24h")
        now = time.time()
        batch = AzureBatch(f"batch_{uuid.uuid4()}", body["input_file_id"],
                           body.get("metadata"), now, now + self.batch_seconds, lines)
        self.batches[batch.id] = batch
        return JSONResponse(batch.as_json())

    def _advance(self, batch: AzureBatch) -> AzureBatch:
        if batch.status == "in_progress" and time.time() >= batch.ready_at:
            output = "".join(json.dumps(_answer(line)) + "\n" for line in batch.lines)
            batch.output_file_id = f"file-{uuid.uuid4().hex}"
            self.files[batch.output_file_id] = output.encode()
            batch.status = "completed"
        return batch

    async def retrieve(self, batch_id: str, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        if batch_id not in self.batches:
            return _bad("no such batch", 404)
        return JSONResponse(self._advance(self.batches[batch_id]).as_json())

    async def listing(self, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        newest = sorted(self.batches.values(), key=lambda b: b.created, reverse=True)
        after = request.query_params.get("after")
        if after is not None:
            ids = [b.id for b in newest]
            newest = newest[ids.index(after) + 1:] if after in ids else []
        limit = int(request.query_params.get("limit", "20"))
        page = [self._advance(b).as_json() for b in newest[:limit]]
        return JSONResponse({"object": "list", "data": page,
                             "first_id": page[0]["id"] if page else None,
                             "last_id": page[-1]["id"] if page else None,
                             "has_more": len(newest) > limit})

    async def cancel(self, batch_id: str, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        batch = self.batches.get(batch_id)
        if batch is None:
            return _bad("no such batch", 404)
        if self._advance(batch).status == "in_progress":
            batch.status = "cancelled"
        return JSONResponse(batch.as_json())

    async def content(self, file_id: str, request: Request) -> Response:
        if (refused := self._refused(request)) is not None:
            return refused
        if file_id not in self.files:
            return _bad("no such file", 404)
        self.wire.seen["batch-downloads"] += 1
        return Response(self.files[file_id], media_type="application/octet-stream")


def _bad(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"code": "BadRequest" if status == 400 else "NotFound",
                                   "message": message}}, status_code=status)

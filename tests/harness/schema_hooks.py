"""Schemathesis hooks (tests/cluster/schemathesis.toml) for the rules the OpenAPI document
states but a generator cannot read from it: what a JSONL file holds, JSON inside a text
field (`contentSchema`), two cursors that exclude each other, a webhook host that must
resolve to an allowed address, a Message Batch's custom_ids unique and no NUL anywhere in
it (PostgreSQL stores none; the requests' params are free-form).

Each hook turns a case schemathesis means to be valid into one that is, so
`positive_data_acceptance` tests the rest of the request; cases meant to be invalid are
left alone. Every case gets an Idempotency-Key of its own: a key names one creation, and
a case reusing another's would be answered with that creation's job. A long-poll waits a
second at most, to keep the run short. After a webhook endpoint is made, the oldest are
removed, so the tenant stays under its limit of endpoints. A case whose only fault is
an unknown header is left out: HTTP has servers ignore those.
"""

import json
import os
import re
import sys
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import schemathesis

# One OpenAI batch line for the cluster's "fast" route (tests/harness/openai_cluster.py).
JSONL_FILE = (b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", '
              b'"body": {"model": "fast-model", "messages": [{"role": "user", '
              b'"content": "hi"}]}}\n')
# Where the cluster lets webhooks go (QUOTAFLOW_WEBHOOK_ALLOWED_NETWORKS).
WEBHOOK_URL = "http://127.0.0.1:9/hook"
KEPT_ENDPOINTS = 5
KEY = re.compile(r"^[\x21-\x7e]{1,255}$")  # api.deps.IdempotencyKey
MAX_WAIT_S = 1.0
# Hypothesis describes its filters by parsing schemathesis' sources; deep in the coverage
# phase's recursion, CPython 3.11 may otherwise fail that parse.
sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))


def _without_nul(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, list):
        return [_without_nul(item) for item in value]
    if isinstance(value, dict):
        return {_without_nul(key): _without_nul(item) for key, item in value.items()}
    return value


def _json_text(value: Any) -> str:
    """A generated text made into what `contentSchema` asks for: a JSON object of strings."""
    return json.dumps({"note": str(value).replace("\x00", "")})


def _upload(case: schemathesis.Case) -> None:
    if isinstance(case.body, dict):
        case.body["file"] = JSONL_FILE
        if "metadata" in case.body:
            case.body["metadata"] = _json_text(case.body["metadata"])


def _jsonl_body(case: schemathesis.Case) -> None:
    case.body = JSONL_FILE
    if case.query and "metadata" in case.query:
        case.query["metadata"] = _json_text(case.query["metadata"])


def _one_cursor(case: schemathesis.Case) -> None:
    if case.query and "before_id" in case.query and "after_id" in case.query:
        del case.query["before_id"]


def _message_batch(case: schemathesis.Case) -> None:
    case.body = _without_nul(case.body)
    requests = case.body.get("requests") if isinstance(case.body, dict) else None
    for number, request in enumerate(requests if isinstance(requests, list) else []):
        if isinstance(request, dict) and "custom_id" in request:
            request["custom_id"] = f"r{number}"


def _webhook(case: schemathesis.Case) -> None:
    if isinstance(case.body, dict):
        case.body["url"] = WEBHOOK_URL


VALID: dict[tuple[str, str], Callable[[schemathesis.Case], None]] = {
    ("POST", "/jobs"): _upload,
    ("POST", "/v1/files"): _upload,
    ("POST", "/jobs/jsonl"): _jsonl_body,
    ("GET", "/v1/messages/batches"): _one_cursor,
    ("POST", "/v1/messages/batches"): _message_batch,
    ("POST", "/webhooks"): _webhook,
}


# The header schemathesis adds to a case meant to carry an unexpected header. A recipient
# must ignore header fields it does not recognise (RFC 9110, section 5.1), so such a case
# is not one the server may refuse.
UNKNOWN_HEADER = "x-schemathesis-unknown-property"


@schemathesis.hook
def filter_case(_context: schemathesis.HookContext, case: schemathesis.Case) -> bool:
    return not any(name.lower() == UNKNOWN_HEADER for name in (case.headers or {}))


@schemathesis.hook
def map_case(_context: schemathesis.HookContext, case: schemathesis.Case) -> schemathesis.Case:
    key = (case.headers or {}).get("Idempotency-Key")
    if isinstance(key, str) and KEY.match(key):  # an invalid one stays, as the case meant
        case.headers["Idempotency-Key"] = uuid.uuid4().hex
    wait = (case.query or {}).get("wait")
    if isinstance(wait, int | float) and not isinstance(wait, bool) and wait > MAX_WAIT_S:
        case.query["wait"] = MAX_WAIT_S
    make_valid = VALID.get((case.method.upper(), case.operation.path))
    if make_valid is not None and (case.meta is None or case.meta.generation.mode.is_positive):
        make_valid(case)
    return case


@schemathesis.hook
def after_call(_context: schemathesis.HookContext, case: schemathesis.Case,
               response: Any) -> None:
    if (case.method.upper(), case.operation.path) != ("POST", "/webhooks"):
        return
    if response.status_code != 201:
        return
    base = os.environ["QF_SCHEMA_API_URL"]
    headers = {"Authorization": f"Bearer {os.environ['QF_SCHEMA_API_KEY']}"}
    made = httpx.get(f"{base}/webhooks", headers=headers, timeout=10).json()["data"]
    for endpoint in made[:-KEPT_ENDPOINTS]:
        httpx.delete(f"{base}/webhooks/{endpoint['id']}", headers=headers, timeout=10)

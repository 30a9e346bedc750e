"""The conformance set: real-world request lines and what each deployment family is sent.

Each `NAME.jsonl` here holds one entry per line, a JSON object:

    {"name": "o-vision-url",              unique in the set; the line's custom_id
     "line": {...},                       the batch input line, as a user writes it
                                          (OpenAI Batch or Anthropic {"custom_id", "params"})
     "openai": "unchanged" | {...} | {"error": "FIELD"} | {"unsupported": true},
     "anthropic": "unchanged" | {...} | {"error": "FIELD"} | {"unsupported": true}}

`openai` is the body an OpenAI-compatible deployment must receive, `anthropic` the one
an anthropic deployment must receive: "unchanged" means the line's own body (or
params) as written, an object the translated request, `{"error": FIELD}` that the line
must fail naming FIELD (e.g. "body.logit_bias") and nothing be sent, `{"unsupported":
true}` that the family does not serve the line's endpoint (it fails with
`unsupported_endpoint`, naming the endpoint and the deployment). `model` is left out of
the expected bodies: the deployment sets it. Files by endpoint and input shape, one
endpoint a file (as in a batch): chat_openai.jsonl (/v1/chat/completions lines),
messages_anthropic.jsonl (Anthropic Message Batches lines), responses_openai.jsonl,
embeddings_openai.jsonl, moderations_openai.jsonl and completions_openai.jsonl.

tests/unit/providers/test_conformance.py checks the translations in process;
tests/cluster/test_conformance_cluster.py runs every file as jobs through Celery workers
against the strict mock provider, which records what it received (`--record`).
`field_diff` compares a body sent with the one expected.
"""

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
UNCHANGED = "unchanged"


def names() -> list[str]:
    """The set's files, without .jsonl."""
    return sorted(path.stem for path in HERE.glob("*.jsonl"))


def lines(name: str) -> list[dict[str, Any]]:
    """The entries of NAME.jsonl, in file order."""
    with (HERE / f"{name}.jsonl").open(encoding="utf-8") as file:
        return [json.loads(line) for line in file if line.strip()]


def url(entry: dict[str, Any]) -> str:
    """The entry's endpoint (an Anthropic line's is chat's)."""
    return entry["line"].get("url", "/v1/chat/completions")


def expected(entry: dict[str, Any], family: str) -> dict[str, Any]:
    """The body `family` ("openai" or "anthropic") must receive, model left out, or
    {"error": FIELD}, or {"unsupported": True}."""
    want = entry[family]
    if want != UNCHANGED:
        return want
    line = entry["line"]
    own = line["body"] if "body" in line else line["params"]
    return {key: value for key, value in own.items() if key != "model"}


def field_diff(want: dict[str, Any], got: dict[str, Any]) -> list[str]:
    """The top-level fields that differ, each with both values."""
    want, got = comparable(want), comparable(got)
    return [f"{key}: expected {want.get(key)!r}, sent {got.get(key)!r}"
            for key in sorted(set(want) | set(got)) if want.get(key) != got.get(key)]


def comparable(body: dict[str, Any]) -> dict[str, Any]:
    """Tool calls' `arguments` (JSON text) as the JSON they hold: the store keeps a line's
    JSON objects, not the order of their keys (PostgreSQL's jsonb), on either side."""
    body = json.loads(json.dumps(body))
    for message in body.get("messages") or ():
        for call in message.get("tool_calls") or () if isinstance(message, dict) else ():
            function = call.get("function") or {}
            if isinstance(function.get("arguments"), str):
                function["arguments"] = json.loads(function["arguments"])
    return body

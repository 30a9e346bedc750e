"""JSONL in and out, in the shapes users already have files in.

In: the OpenAI Batch line {"custom_id", "method", "url", "body"} (canonical),
the Anthropic Message Batches line {"custom_id", "params"}, and the shorthand
{"prompt": "..."} or {"messages": [...]} (custom_id defaults to the line
number). Every accepted line becomes a `Request` in OpenAI's shape; every
refused line becomes a `BadLine` naming its line number and reason. The file
is read in 1 MiB blocks and never held whole (quotaflow/ingest/jsonlines.py reads the
lines and their JSON). An Anthropic line keeps its params as written (under
ANTHROPIC_PARAMS) beside a view in OpenAI's shape that routes and counts it: an
anthropic deployment sends the params as they are, others their translation
(quotaflow/providers/translate/). (Out: OpenAI batch output lines or
Anthropic results, quotaflow/results/output.py.)
"""

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any, Literal, overload

import orjson

from quotaflow.constants import (
    ANTHROPIC_PARAMS,
    ENDPOINT_CHAT,
    ENDPOINT_COMPLETIONS,
    ENDPOINT_EMBEDDINGS,
    ENDPOINT_MODERATIONS,
    ENDPOINT_RESPONSES,
    ENDPOINTS,
)
from quotaflow.ingest.body_checks import moderations_problem, responses_problem
from quotaflow.ingest.jsonlines import load_object, read_lines
from quotaflow.providers.translate.chat_view import counting_view

MAX_CUSTOM_ID_CHARS = 512  # the items.custom_id column
_DIGEST_PREFIX: dict[str, "hashlib._Hash"] = {}  # endpoint -> sha256 of '["endpoint",'
# The newer endpoints' bodies, checked field by field (quotaflow/ingest/body_checks.py).
_BODY_CHECKS = {ENDPOINT_RESPONSES: responses_problem, ENDPOINT_MODERATIONS: moderations_problem}
_TOKEN_LIMITS = ("max_tokens", "max_completion_tokens")


@dataclass(slots=True)
class Request:
    """One accepted input line, in OpenAI Batch form. Not frozen: a frozen dataclass
    sets each field through object.__setattr__, which made this four times as slow to
    build (ingest builds one a line)."""

    line_no: int
    custom_id: str
    url: str
    body: dict[str, Any]


@dataclass(slots=True)
class BadLine:
    """One refused input line; it becomes a failed item, never a lost one."""

    line_no: int
    custom_id: str | None
    reason: str


class LineRejected(ValueError):
    """Raised inside line parsing; carries the reason shown to the user."""


def parse_stream(stream: IO[bytes], max_line_bytes: int) -> Iterator[Request | BadLine]:
    """Parse every non-blank line of a JSONL byte stream, in order."""
    for line_no, raw in read_lines(stream, max_line_bytes):
        if raw is None:
            yield BadLine(line_no, None, f"line is longer than the limit of {max_line_bytes} bytes")
            continue
        if not raw.strip():
            continue
        yield parse_line(line_no, raw)


def parse_line(line_no: int, raw: bytes) -> Request | BadLine:
    obj = load_object(raw)
    if isinstance(obj, str):
        return BadLine(line_no, None, obj)
    try:
        return to_request(line_no, obj)
    except LineRejected as exc:
        return BadLine(line_no, line_custom_id(obj), str(exc))


def line_custom_id(obj: dict[str, Any]) -> str | None:
    """The custom_id a refused line keeps in its error line, when it has a usable one: one
    too long for the column is left out (cut short, it could be another line's id)."""
    value = obj.get("custom_id")
    if isinstance(value, str) and 0 < len(value) <= MAX_CUSTOM_ID_CHARS:
        return value
    return None


def to_request(line_no: int, obj: dict[str, Any]) -> Request:
    """A line's object as a request in OpenAI's shape; LineRejected says why not."""
    if "body" in obj or "url" in obj or "method" in obj:
        custom_id = _custom_id(obj, required=True)
        return _openai_line(line_no, custom_id, obj)
    if "params" in obj:
        custom_id = _custom_id(obj, required=True)
        return Request(line_no, custom_id, ENDPOINT_CHAT, _anthropic_params(obj["params"]))
    if "prompt" in obj or "messages" in obj:
        custom_id = _custom_id(obj, required=False) or str(line_no)
        return Request(line_no, custom_id, ENDPOINT_CHAT, _shorthand_body(obj))
    raise LineRejected(
        "unknown line format: expected an OpenAI batch line (custom_id, method, url, body), "
        "an Anthropic line (custom_id, params), or a shorthand line with prompt or messages"
    )


@overload
def _custom_id(obj: dict[str, Any], required: Literal[True]) -> str: ...
@overload
def _custom_id(obj: dict[str, Any], required: bool) -> str | None: ...
def _custom_id(obj: dict[str, Any], required: bool) -> str | None:
    value = obj.get("custom_id")
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise LineRejected("custom_id must be a non-empty string")
    if len(value) > MAX_CUSTOM_ID_CHARS:
        raise LineRejected(f"custom_id is longer than {MAX_CUSTOM_ID_CHARS} characters")
    return value


def _openai_line(line_no: int, custom_id: str, obj: dict[str, Any]) -> Request:
    method = obj.get("method")
    if method != "POST":
        raise LineRejected(f"method must be \"POST\", got {method!r}")
    url = obj.get("url")
    if url not in ENDPOINTS:
        raise LineRejected(f"url must be one of {', '.join(ENDPOINTS)}, got {url!r}")
    body = obj.get("body")
    if not isinstance(body, dict):
        raise LineRejected("body must be a JSON object")
    _check_body(url, body)
    return Request(line_no, custom_id, url, body)


def _check_body(url: str, body: dict[str, Any]) -> None:
    if not isinstance(body.get("model", ""), str):
        raise LineRejected("body.model must be a string")
    if ANTHROPIC_PARAMS in body:
        raise LineRejected(f"body.{ANTHROPIC_PARAMS} is reserved for quotaflow's own use")
    if url == ENDPOINT_CHAT:
        _check_messages(body.get("messages"))
    elif url == ENDPOINT_COMPLETIONS and not isinstance(body.get("prompt"), str | list):
        raise LineRejected("body.prompt is required for /v1/completions")
    elif url == ENDPOINT_EMBEDDINGS and not isinstance(body.get("input"), str | list):
        raise LineRejected("body.input is required for /v1/embeddings")
    elif url in _BODY_CHECKS and (problem := _BODY_CHECKS[url](body)):
        raise LineRejected(problem)
    for key in _TOKEN_LIMITS:
        value = body.get(key)
        # From JSON, an int that is not a bool is exactly `type(value) is int`.
        if value is not None and (type(value) is not int or value <= 0):
            raise LineRejected(f"body.{key} must be a positive integer")


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise LineRejected("body.messages must be a non-empty list")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise LineRejected(f"body.messages[{index}] must be an object with a role")
        if "content" not in message:
            raise LineRejected(f"body.messages[{index}] has no content")


# An Anthropic beta's name, as the anthropic-beta header lists them.
BETA_NAME = re.compile(r"[A-Za-z0-9._-]{1,100}")


def _anthropic_params(params: Any) -> dict[str, Any]:
    """Anthropic Message Batches params, kept as written (an anthropic deployment sends
    them so), beside a view in OpenAI's shape that routes and counts the line. Any content
    block Anthropic defines is accepted: what an OpenAI-compatible deployment cannot take
    fails the line there, when it is translated (quotaflow/providers/translate/)."""
    if not isinstance(params, dict):
        raise LineRejected("params must be a JSON object")
    max_tokens = params.get("max_tokens")
    if isinstance(max_tokens, float) and max_tokens.is_integer():  # JSON's 5.0 is an integer
        max_tokens = params["max_tokens"] = int(max_tokens)
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens <= 0:
        raise LineRejected("params.max_tokens must be a positive integer (Anthropic requires it)")
    if "model" in params and not isinstance(params["model"], str):
        raise LineRejected("params.model must be a string")
    messages = params.get("messages")
    if not isinstance(messages, list) or not messages:
        raise LineRejected("params.messages must be a non-empty list")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise LineRejected(f"params.messages[{index}] must be an object with role "
                               "\"user\" or \"assistant\"")
        _check_blocks(message.get("content"), f"params.messages[{index}].content")
    if params.get("system") is not None:
        _check_blocks(params["system"], "params.system")
    if "betas" in params:  # sent as the anthropic-beta header (providers/anthropic.py)
        betas = params["betas"]
        if not isinstance(betas, list) or not all(
                isinstance(b, str) and BETA_NAME.fullmatch(b) for b in betas):
            raise LineRejected("params.betas must be a list of beta names (e.g. "
                               "\"context-1m-2025-08-07\"), sent as the anthropic-beta header")
    body = counting_view(params)
    body[ANTHROPIC_PARAMS] = params
    return body


def _check_blocks(content: Any, path: str) -> None:
    """A string, or a list of content blocks (objects with a string `type`)."""
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise LineRejected(f"{path} must be a string or a list of content blocks")
    for index, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise LineRejected(f"{path}[{index}] must be a content block (an object with a "
                               "type)")


def _shorthand_body(obj: dict[str, Any]) -> dict[str, Any]:
    body = {k: v for k, v in obj.items() if k not in ("custom_id", "prompt")}
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str) or not obj["prompt"]:
            raise LineRejected("prompt must be a non-empty string")
        body["messages"] = [*body.get("messages", []), {"role": "user", "content": obj["prompt"]}]
    _check_body(ENDPOINT_CHAT, body)
    return body


def canonical_body(body: dict[str, Any]) -> bytes:
    """The body as compact JSON with sorted keys: what is stored, and what is hashed."""
    try:
        return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # an integer beyond 64 bits (see load_object): exact, if slower
        return json.dumps(body, sort_keys=True, separators=(",", ":"),
                          ensure_ascii=False).encode()


def body_digest(url: str, canonical: bytes) -> bytes:
    """Equal for identical requests (key order aside), which are then sent only once:
    SHA-256 of ["url",body], continued from a hash of the endpoint's prefix."""
    prefix = _DIGEST_PREFIX.get(url)
    if prefix is None:
        prefix = _DIGEST_PREFIX.setdefault(url, hashlib.sha256(b'["' + url.encode() + b'",'))
    digest = prefix.copy()
    digest.update(canonical)
    digest.update(b"]")
    return digest.digest()


def request_digest(url: str, body: dict[str, Any]) -> str:
    """body_digest as stored in items.body_hash (hex)."""
    return body_digest(url, canonical_body(body)).hex()

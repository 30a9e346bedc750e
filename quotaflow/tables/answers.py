"""An output or error line as answer columns: the text, its JSON where it is JSON,
usage, finish reason and error.

Reads OpenAI batch output lines (chat completions, completions, responses) and
Anthropic Message Batches result lines, the two shapes a job's output comes in.
`response_json` is the text parsed where it is a JSON object or array (what a
`response_format` asks for), kept as compact JSON text so that every row of a column
has one type whatever the schema.
"""

import contextlib
from typing import Any

import orjson
import pyarrow as pa

ANSWER_FIELDS = [
    pa.field("custom_id", pa.string()),
    pa.field("response_text", pa.string()),
    pa.field("response_json", pa.string()),
    pa.field("prompt_tokens", pa.int64()),
    pa.field("completion_tokens", pa.int64()),
    pa.field("finish_reason", pa.string()),
    pa.field("error", pa.string()),
]
ANSWER_NAMES = [field.name for field in ANSWER_FIELDS]


def answer(line: dict[str, Any] | None) -> dict[str, Any]:
    """The answer columns of one line; every one None for a row with no line yet."""
    columns: dict[str, Any] = dict.fromkeys(ANSWER_NAMES)
    if line is None:
        return columns
    columns["custom_id"] = line.get("custom_id")
    if isinstance(line.get("result"), dict):  # Anthropic's Message Batches result
        _anthropic(line["result"], columns)
        return columns
    response = line.get("response") or {}
    body = response.get("body") if isinstance(response, dict) else None
    error = line.get("error")
    if isinstance(error, dict) and error:
        columns["error"] = error.get("message") or error.get("code") or "error"
    elif response.get("status_code", 200) >= 400 or not isinstance(body, dict):
        columns["error"] = _body_error(body) or f"HTTP {response.get('status_code')}"
    if isinstance(body, dict) and columns["error"] is None:
        _openai(body, columns)
    return columns


def _body_error(body: Any) -> str | None:
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else None


def _openai(body: dict[str, Any], columns: dict[str, Any]) -> None:
    usage = body.get("usage") or {}
    columns["prompt_tokens"] = usage.get("prompt_tokens", usage.get("input_tokens"))
    columns["completion_tokens"] = usage.get("completion_tokens", usage.get("output_tokens"))
    choices = body.get("choices")
    if isinstance(choices, list) and choices:
        choice = choices[0]
        message = choice.get("message") or {}
        text = message.get("content") if message else choice.get("text")
        if text is None and message.get("refusal"):
            columns["error"] = f"refused: {message['refusal']}"
        columns["finish_reason"] = choice.get("finish_reason")
        _text(text, columns)
    elif isinstance(body.get("output"), list):  # /v1/responses
        parts = [part.get("text", "") for item in body["output"] if isinstance(item, dict)
                 for part in item.get("content") or [] if isinstance(part, dict)
                 and part.get("type") == "output_text"]
        columns["finish_reason"] = body.get("status")
        _text("".join(parts), columns)


def _anthropic(result: dict[str, Any], columns: dict[str, Any]) -> None:
    if result.get("type") != "succeeded":
        error = (result.get("error") or {}).get("error") or result.get("error") or {}
        columns["error"] = error.get("message") or result.get("type")
        return
    message = result.get("message") or {}
    usage = message.get("usage") or {}
    columns["prompt_tokens"] = usage.get("input_tokens")
    columns["completion_tokens"] = usage.get("output_tokens")
    columns["finish_reason"] = message.get("stop_reason")
    _text("".join(block.get("text", "") for block in message.get("content") or []
                  if isinstance(block, dict) and block.get("type") == "text"), columns)


def _text(text: Any, columns: dict[str, Any]) -> None:
    if not isinstance(text, str):
        return
    columns["response_text"] = text
    stripped = text.strip()
    if stripped[:1] in ("{", "["):
        with contextlib.suppress(orjson.JSONDecodeError):
            columns["response_json"] = orjson.dumps(orjson.loads(stripped)).decode()

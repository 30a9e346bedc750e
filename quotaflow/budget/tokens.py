"""Token counts the way providers count them at admission.

OpenAI admits a request against TPM by about characters / 4 of the prompt
plus max_tokens (the most the reply may use); the real count arrives later in
`usage`. The limiter and the mock provider both count with these functions, so
they run once per request at admission and walk the body once, without
re-encoding it: text is counted by its characters, images and files by their own
rule (quotaflow/budget/image_tokens.py), never by their base64. The rule is docs/formats/input.md's.
"""

import json
from typing import Any

from quotaflow.budget.image_tokens import file_tokens, image_tokens
from quotaflow.constants import (
    ENDPOINT_COMPLETIONS,
    ENDPOINT_EMBEDDINGS,
    ENDPOINT_MODERATIONS,
    ENDPOINT_RESPONSES,
    INPUT_ONLY_ENDPOINTS,
)

# Content part types whose `text` is the prompt (chat, responses, moderations).
_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})
# The reply's ceiling, by the name each endpoint gives it (the first one set counts).
_OUTPUT_LIMITS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def estimate_tokens(text: str) -> int:
    """About four characters a token, at least one."""
    return max(1, (len(text) + 3) // 4)


def prompt_parts(url: str, body: dict[str, Any]) -> tuple[str, int]:
    """The text a request sends, flattened, and the tokens of its images and files,
    which are counted by their own rule rather than as text."""
    if url == ENDPOINT_EMBEDDINGS:
        return _as_text(body.get("input", "")), 0
    if url == ENDPOINT_COMPLETIONS:
        return _as_text(body.get("prompt", "")), 0
    texts: list[str] = []
    if url == ENDPOINT_RESPONSES:
        instructions = body.get("instructions")
        if isinstance(instructions, str):
            texts.append(instructions)
        fixed = _items(body.get("input", ""), texts)
    elif url == ENDPOINT_MODERATIONS:
        fixed = _moderation(body.get("input", ""), texts)
    else:
        fixed = _messages(body.get("messages", []), texts)
    return "\n".join(texts), fixed


def prompt_text(url: str, body: dict[str, Any]) -> str:
    """The text a request sends, flattened (its images and files left out)."""
    return prompt_parts(url, body)[0]


def prompt_tokens(url: str, body: dict[str, Any]) -> int:
    """The prompt's tokens at admission: its text at characters / 4, plus its images
    and files."""
    text, fixed = prompt_parts(url, body)
    return estimate_tokens(text) + fixed


def max_output_tokens(body: dict[str, Any], default: int) -> int:
    """The reply's token ceiling: max_completion_tokens, max_tokens, max_output_tokens
    (/v1/responses), or the default."""
    for key in _OUTPUT_LIMITS:
        value = body.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return default


def admission_tokens(url: str, body: dict[str, Any], default_max_tokens: int) -> int:
    """Tokens a provider charges against TPM when it admits the request: embeddings and
    moderations have no output tokens."""
    prompt = prompt_tokens(url, body)
    if url in INPUT_ONLY_ENDPOINTS:
        return prompt
    return prompt + max_output_tokens(body, default_max_tokens)


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _messages(messages: Any, texts: list[str]) -> int:
    """Chat messages: string content as is, content parts by type."""
    fixed = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            fixed += _parts(content, texts)
        elif content is not None:
            texts.append(json.dumps(content))
    return fixed


def _items(value: Any, texts: list[str]) -> int:
    """A /v1/responses input: a string, or input items (messages with content parts;
    any other item, such as a function call's output, counted as written)."""
    if isinstance(value, str):
        texts.append(value)
        return 0
    fixed = 0
    for item in value:
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            fixed += _parts(content, texts)
        else:
            texts.append(_as_text(item))
    return fixed


def _moderation(value: Any, texts: list[str]) -> int:
    """A /v1/moderations input: a string, strings, or text and image_url parts."""
    if isinstance(value, str):
        texts.append(value)
        return 0
    fixed = 0
    for entry in value:
        if isinstance(entry, str):
            texts.append(entry)
        else:
            fixed += _part(entry, texts)
    return fixed


def _parts(parts: list[Any], texts: list[str]) -> int:
    fixed = 0
    for part in parts:
        fixed += _part(part, texts)
    return fixed


def _part(part: Any, texts: list[str]) -> int:
    """A content part: its text into `texts`, or the tokens of an image or a file (their
    base64 is never text). A part of another kind (audio, ...) is counted as written."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in _TEXT_PARTS:
        texts.append(_as_text(part.get("text", "")))
    elif kind == "image_url":  # chat and moderations: {"url", "detail"}
        image = part.get("image_url")
        if isinstance(image, dict):
            return image_tokens(image.get("url"), image.get("detail"))
        return image_tokens(image)
    elif kind == "input_image":  # responses: image_url (or file_id) and detail
        return image_tokens(part.get("image_url"), part.get("detail"))
    elif kind == "input_file":  # responses: file_data, file_id or file_url
        return file_tokens(part.get("file_data"))
    elif kind == "file":  # chat: {"file": {"file_data" | "file_id", "filename"}}
        inner = part.get("file")
        return file_tokens(inner.get("file_data") if isinstance(inner, dict) else None)
    elif kind == "refusal":
        texts.append(_as_text(part.get("refusal", "")))
    else:
        texts.append(_as_text(part))
    return 0

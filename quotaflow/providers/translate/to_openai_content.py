"""Anthropic messages, content blocks and tools as OpenAI chat messages, parts and tools.

A user turn's `tool_result` blocks become `tool` messages (in their place among the
turn's other blocks, which stay a user message); an assistant turn's `tool_use` blocks
become its `tool_calls`. Images and base64 PDFs become `image_url` and `file` parts, a
plain-text document a text part. `cache_control` is dropped: OpenAI caches prompts by
itself. Thinking blocks, server tools, citations, URL or file-id documents and the like
have no OpenAI chat form and fail the line by name.
"""

from typing import Any

import orjson

from quotaflow.providers.translate import TO_OPENAI, untranslatable

# The filename a base64 PDF gets where its block has no title (OpenAI requires one).
DEFAULT_FILENAME = "document.pdf"


def system_message(system: Any) -> dict[str, Any]:
    """`system` (a string or text blocks) as a system message."""
    if isinstance(system, str):
        return {"role": "system", "content": system}
    return {"role": "system", "content": _texts(
        [_text_part(b, f"params.system[{n}]") for n, b in enumerate(system)])}


def convert_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    last = len(messages) - 1
    for index, message in enumerate(messages):
        path = f"params.messages[{index}]"
        role, content = message.get("role"), message.get("content")
        for key in message:
            if key not in ("role", "content"):
                raise untranslatable(f"{path}.{key}", TO_OPENAI)
        if role == "assistant":
            if index == last:
                raise untranslatable(path, TO_OPENAI, "a final assistant turn (prefill)")
            out.append(_assistant(content, path))
        elif isinstance(content, str):
            out.append({"role": "user", "content": content})
        else:
            out += _user(content or [], path)
    return out


def _user(blocks: list[dict[str, Any]], path: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for n, block in enumerate(blocks):
        where = f"{path}.content[{n}]"
        if block.get("type") == "tool_result":
            if parts:
                out.append({"role": "user", "content": parts})
                parts = []
            out.append(_tool_message(block, where))
        else:
            parts.append(_part(block, where))
    if parts:
        out.append({"role": "user", "content": parts})
    return out


def _part(block: dict[str, Any], path: str) -> dict[str, Any]:
    kind = block.get("type")
    if kind == "text":
        return _text_part(block, path)
    if kind == "image":
        _only(block, path, {"type", "source", "cache_control"})
        return {"type": "image_url", "image_url": {"url": _image_url(block, path)}}
    if kind == "document":
        return _document(block, path)
    raise untranslatable(path, TO_OPENAI, f"a {kind!r} block")


def _text_part(block: dict[str, Any], path: str) -> dict[str, Any]:
    if block.get("type") != "text":
        raise untranslatable(path, TO_OPENAI, f"a {block.get('type')!r} block here")
    _only(block, path, {"type", "text", "cache_control"})
    return {"type": "text", "text": block.get("text", "")}


def _only(block: dict[str, Any], path: str, keys: set[str]) -> None:
    for key, value in block.items():
        if key not in keys and value not in (None, [], {"enabled": False}):
            raise untranslatable(f"{path}.{key}", TO_OPENAI)


def _image_url(block: dict[str, Any], path: str) -> str:
    source = block.get("source") or {}
    if source.get("type") == "base64":
        return f"data:{source.get('media_type')};base64,{source.get('data')}"
    if source.get("type") == "url":
        return str(source.get("url"))
    raise untranslatable(f"{path}.source", TO_OPENAI, f"a {source.get('type')!r} image source")


def _document(block: dict[str, Any], path: str) -> dict[str, Any]:
    source = block.get("source") or {}
    kind = source.get("type")
    if kind == "text":
        _only(block, path, {"type", "source", "cache_control", "citations"})
        return {"type": "text", "text": source.get("data", "")}
    if kind == "base64" and source.get("media_type") == "application/pdf":
        _only(block, path, {"type", "source", "cache_control", "citations", "title"})
        return {"type": "file", "file": {
            "filename": block.get("title") or DEFAULT_FILENAME,
            "file_data": f"data:application/pdf;base64,{source.get('data')}"}}
    raise untranslatable(f"{path}.source", TO_OPENAI, f"a {kind!r} document source")


def _tool_message(block: dict[str, Any], path: str) -> dict[str, Any]:
    _only(block, path, {"type", "tool_use_id", "content", "cache_control", "is_error"})
    if block.get("is_error"):
        raise untranslatable(f"{path}.is_error", TO_OPENAI)
    content = block.get("content")
    if isinstance(content, list):
        content = _texts([_text_part(b, f"{path}.content[{n}]")
                          for n, b in enumerate(content)])
    return {"role": "tool", "tool_call_id": block.get("tool_use_id"),
            "content": "" if content is None else content}


def _assistant(content: Any, path: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for n, block in enumerate(content or []):
        where = f"{path}.content[{n}]"
        if block.get("type") == "tool_use":
            _only(block, where, {"type", "id", "name", "input", "cache_control"})
            calls.append({"id": block.get("id"), "type": "function", "function": {
                "name": block.get("name"),
                "arguments": orjson.dumps(block.get("input", {})).decode()}})
        else:
            texts.append(_text_part(block, where))
    message: dict[str, Any] = {"role": "assistant", "content": _texts(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    return message


def _texts(parts: list[dict[str, Any]]) -> Any:
    """One text part as a plain string (what every OpenAI-compatible server takes)."""
    return parts[0]["text"] if len(parts) == 1 else parts


def tools(definitions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Anthropic's custom tools as OpenAI function tools; server tools are refused."""
    out = []
    for index, tool in enumerate(definitions):
        path = f"params.tools[{index}]"
        if tool.get("type") not in (None, "custom"):
            raise untranslatable(path, TO_OPENAI, f"the {tool.get('type')!r} server tool")
        _only(tool, path, {"type", "name", "description", "input_schema", "strict",
                           "cache_control"})
        function: dict[str, Any] = {"name": tool.get("name")}
        if tool.get("description") is not None:
            function["description"] = tool["description"]
        function["parameters"] = tool.get("input_schema")
        if tool.get("strict") is not None:
            function["strict"] = tool["strict"]
        out.append({"type": "function", "function": function})
    return out

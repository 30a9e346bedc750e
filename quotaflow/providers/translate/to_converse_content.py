"""Anthropic messages, content blocks and tools as Bedrock Converse's messages and blocks.

Converse names each block by its one key (`{"text": ...}`, `{"image": {...}}`,
`{"toolUse": {...}}`) where Anthropic has a `type`; images and documents travel as
base64 `bytes` (Converse takes bytes or S3 locations, never a URL); `cache_control` on
a block becomes a `cachePoint` block right after it, which is how Converse marks the
end of a cached prefix. Thinking blocks of earlier turns go back as `reasoningContent`
with their signatures. What Converse cannot carry (URL sources, citations, server
tools, a tool choice of none) fails the line by name.
"""

import re
from typing import Any

from quotaflow.errors import Untranslatable

TO_CONVERSE = "Bedrock Converse"
IMAGE_FORMATS = {"image/jpeg": "jpeg", "image/png": "png", "image/gif": "gif",
                 "image/webp": "webp"}
# Converse's document names: letters, digits, single spaces, hyphens, parentheses and
# square brackets; anything else becomes a hyphen (a name is a label the model reads).
_NAME_REFUSED = re.compile(r"[^A-Za-z0-9 \-()\[\]]+")
DEFAULT_DOCUMENT_NAME = "document"


def refuse(path: str, detail: str = "", target: str = TO_CONVERSE) -> Untranslatable:
    """The error of a field at `path` that a Bedrock API cannot take."""
    what = f"{path} ({detail})" if detail else path
    return Untranslatable(path, f"{what} has no {target} equivalent; remove it or route this "
                                "model to a deployment that takes it")


def only(block: dict[str, Any], path: str, keys: set[str]) -> None:
    for key, value in block.items():
        if key not in keys and value is not None:
            raise refuse(f"{path}.{key}")


def cache_point(block: dict[str, Any]) -> dict[str, Any] | None:
    """The cachePoint that follows a block with cache_control (its ttl kept), or None."""
    control = block.get("cache_control")
    if control is None:
        return None
    point: dict[str, Any] = {"type": "default"}
    if isinstance(control, dict) and control.get("ttl") is not None:
        point["ttl"] = control["ttl"]
    return {"cachePoint": point}


def system_blocks(system: Any) -> list[dict[str, Any]]:
    if isinstance(system, str):
        return [{"text": system}] if system else []
    out: list[dict[str, Any]] = []
    for n, block in enumerate(system):
        path = f"params.system[{n}]"
        if block.get("type") != "text":
            raise refuse(path, f"a {block.get('type')!r} block")
        only(block, path, {"type", "text", "cache_control"})
        out.append({"text": block.get("text", "")})
        if (point := cache_point(block)) is not None:
            out.append(point)
    return out


def messages(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The turns as Converse messages; consecutive turns of one role become one message,
    as Anthropic itself joins them (Converse refuses roles that do not alternate)."""
    out: list[dict[str, Any]] = []
    for index, turn in enumerate(turns):
        path = f"params.messages[{index}]"
        only(turn, path, {"role", "content"})
        role, content = turn.get("role"), turn.get("content")
        if role not in ("user", "assistant"):
            raise refuse(f"{path}.role", repr(role))
        blocks = [{"text": content}] if isinstance(content, str) else content_blocks(
            content or [], path)
        if out and out[-1]["role"] == role:
            out[-1]["content"] += blocks
        else:
            out.append({"role": role, "content": blocks})
    return out


def content_blocks(blocks: list[dict[str, Any]], path: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for n, block in enumerate(blocks):
        out.append(_block(block, f"{path}.content[{n}]"))
        if (point := cache_point(block)) is not None:
            out.append(point)
    return out


def _block(block: dict[str, Any], path: str) -> dict[str, Any]:
    kind = block.get("type")
    if kind == "text":
        only(block, path, {"type", "text", "cache_control"})
        return {"text": block.get("text", "")}
    if kind == "image":
        only(block, path, {"type", "source", "cache_control"})
        return {"image": image(block.get("source") or {}, f"{path}.source")}
    if kind == "document":
        return {"document": _document(block, path)}
    if kind == "tool_use":
        only(block, path, {"type", "id", "name", "input", "cache_control"})
        return {"toolUse": {"toolUseId": block.get("id"), "name": block.get("name"),
                            "input": block.get("input", {})}}
    if kind == "tool_result":
        return {"toolResult": _tool_result(block, path)}
    if kind == "thinking":
        only(block, path, {"type", "thinking", "signature"})
        text: dict[str, Any] = {"text": block.get("thinking", "")}
        if block.get("signature"):
            text["signature"] = block["signature"]
        return {"reasoningContent": {"reasoningText": text}}
    if kind == "redacted_thinking":
        only(block, path, {"type", "data"})
        return {"reasoningContent": {"redactedContent": block.get("data", "")}}
    raise refuse(path, f"a {kind!r} block")


def image(source: dict[str, Any], path: str) -> dict[str, Any]:
    """An Anthropic image source as a Converse image: its format and base64 bytes."""
    if source.get("type") != "base64":
        raise refuse(path, f"a {source.get('type')!r} image source: Bedrock takes image bytes "
                           "(base64 or a data: URL), not a URL")
    media_type = source.get("media_type")
    if media_type not in IMAGE_FORMATS:
        raise refuse(f"{path}.media_type", repr(media_type))
    return {"format": IMAGE_FORMATS[media_type], "source": {"bytes": source.get("data", "")}}


def document_name(title: Any) -> str:
    """A title as a Converse document name: a file's extension left off, every run of
    characters Converse refuses made one hyphen, at most 200 characters."""
    text = str(title or "").strip()
    stem, dot, extension = text.rpartition(".")
    if dot and stem and extension.isalnum() and len(extension) <= 5:
        text = stem
    name = re.sub(r" {2,}", " ", _NAME_REFUSED.sub("-", text)).strip()
    return name[:200] or DEFAULT_DOCUMENT_NAME


def _document(block: dict[str, Any], path: str) -> dict[str, Any]:
    only(block, path, {"type", "source", "title", "context", "cache_control", "citations"})
    citations = block.get("citations")
    if isinstance(citations, dict) and citations.get("enabled"):
        raise refuse(f"{path}.citations", "Converse answers citations in a shape of its own")
    source = block.get("source") or {}
    kind = source.get("type")
    made: dict[str, Any] = {"name": document_name(block.get("title"))}
    if kind == "base64" and source.get("media_type") == "application/pdf":
        made |= {"format": "pdf", "source": {"bytes": source.get("data", "")}}
    elif kind == "text":
        made |= {"format": "txt", "source": {"text": source.get("data", "")}}
    else:
        raise refuse(f"{path}.source", f"a {kind!r} document source: Bedrock takes a PDF's "
                                       "bytes or a text")
    if block.get("context") is not None:
        made["context"] = block["context"]
    return made


def _tool_result(block: dict[str, Any], path: str) -> dict[str, Any]:
    only(block, path, {"type", "tool_use_id", "content", "is_error", "cache_control"})
    content = block.get("content")
    if isinstance(content, str):
        parts: list[dict[str, Any]] = [{"text": content}]
    else:
        parts = []
        for n, part in enumerate(content or []):
            where = f"{path}.content[{n}]"
            if part.get("type") == "text":
                only(part, where, {"type", "text", "cache_control"})
                parts.append({"text": part.get("text", "")})
            elif part.get("type") == "image":
                only(part, where, {"type", "source", "cache_control"})
                parts.append({"image": image(part.get("source") or {}, f"{where}.source")})
            else:
                raise refuse(where, f"a {part.get('type')!r} block in a tool result")
    made: dict[str, Any] = {"toolUseId": block.get("tool_use_id"), "content": parts}
    if block.get("is_error"):
        made["status"] = "error"
    return made


def tool_config(tools: list[dict[str, Any]], choice: Any) -> dict[str, Any]:
    """Anthropic's custom tools and tool_choice as Converse's toolConfig."""
    specs: list[dict[str, Any]] = []
    for index, tool in enumerate(tools):
        path = f"params.tools[{index}]"
        if tool.get("type") not in (None, "custom"):
            raise refuse(path, f"the {tool.get('type')!r} server tool")
        only(tool, path, {"type", "name", "description", "input_schema", "strict",
                          "cache_control"})
        spec: dict[str, Any] = {"name": tool.get("name")}
        if tool.get("description") is not None:
            spec["description"] = tool["description"]
        spec["inputSchema"] = {"json": tool.get("input_schema") or {"type": "object"}}
        if tool.get("strict") is not None:
            spec["strict"] = tool["strict"]
        specs.append({"toolSpec": spec})
        if (point := cache_point(tool)) is not None:
            specs.append(point)
    config: dict[str, Any] = {"tools": specs}
    if choice is not None:
        config["toolChoice"] = _tool_choice(choice)
    return config


def _tool_choice(choice: dict[str, Any]) -> dict[str, Any]:
    kind = choice.get("type")
    if choice.get("disable_parallel_tool_use"):
        raise refuse("params.tool_choice.disable_parallel_tool_use")
    only(choice, "params.tool_choice", {"type", "name", "disable_parallel_tool_use"})
    if kind == "auto":
        return {"auto": {}}
    if kind == "any":
        return {"any": {}}
    if kind == "tool":
        return {"tool": {"name": choice.get("name")}}
    raise refuse("params.tool_choice", f"type {kind!r}")

"""OpenAI chat messages, content parts and tools as Anthropic's messages and blocks.

System and developer messages at the start become `system` (a string, or text blocks
where any was given as parts); a `tool` message becomes a `tool_result` block in a user
turn (consecutive ones share it, as Anthropic wants every result of one assistant turn
together); assistant `tool_calls` become `tool_use` blocks. `cache_control` on a part
(the convention of OpenAI-style gateways in front of Claude) is kept on its block.
"""

from typing import Any

import orjson

from quotaflow.providers.translate import TO_ANTHROPIC, untranslatable

IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
_ALLOWED = {"system": {"role", "content"}, "developer": {"role", "content"},
            "user": {"role", "content"},
            "assistant": {"role", "content", "tool_calls", "refusal"},
            "tool": {"role", "content", "tool_call_id"}}


def convert_messages(messages: list[dict[str, Any]]) -> tuple[Any, list[dict[str, Any]]]:
    """(system or None, messages) of an OpenAI messages list."""
    system: list[tuple[str, Any]] = []
    out: list[dict[str, Any]] = []
    results: list[dict[str, Any]] | None = None  # the user turn that tool messages fill
    for index, message in enumerate(messages):
        path = f"body.messages[{index}]"
        role = message.get("role")
        if role not in _ALLOWED:
            raise untranslatable(f"{path}.role", TO_ANTHROPIC, f"role {role!r}")
        for key, value in message.items():
            if key not in _ALLOWED[role] and value is not None:
                raise untranslatable(f"{path}.{key}", TO_ANTHROPIC)
        content = message.get("content")
        if role in ("system", "developer"):
            if out:
                raise untranslatable(path, TO_ANTHROPIC,
                                     "a system message after the conversation started")
            system.append((path, content))
            continue
        if role == "tool":
            block = _tool_result(message, path)
            if results is None:
                results = []
                out.append({"role": "user", "content": results})
            results.append(block)
            continue
        results = None
        if role == "user":
            out.append({"role": "user", "content": _user_content(content, path)})
        else:
            out.append({"role": "assistant", "content": _assistant_content(message, path)})
    return _system(system), out


def _system(parts: list[tuple[str, Any]]) -> Any:
    if not parts:
        return None
    if all(isinstance(content, str) for _, content in parts):
        return "\n\n".join(content for _, content in parts)
    blocks: list[dict[str, Any]] = []
    for path, content in parts:
        if isinstance(content, str):
            blocks.append({"type": "text", "text": content})
        else:
            blocks += [_text_block(p, f"{path}.content[{n}]")
                       for n, p in enumerate(content or ())]
    return blocks


def _user_content(content: Any, path: str) -> Any:
    if not isinstance(content, list):
        return content
    return [_block(part, f"{path}.content[{n}]") for n, part in enumerate(content)]


def _block(part: dict[str, Any], path: str) -> dict[str, Any]:
    kind = part.get("type")
    if kind == "text":
        return _text_block(part, path)
    if kind == "image_url":
        block = {"type": "image", "source": _image_source(part.get("image_url") or {}, path)}
    elif kind == "file":
        block = _document(part.get("file") or {}, path)
    else:
        raise untranslatable(path, TO_ANTHROPIC, f"a {kind!r} content part")
    _only(part, path, {"type", kind, "cache_control"})
    return _cached(block, part)


def _text_block(part: dict[str, Any], path: str) -> dict[str, Any]:
    if part.get("type") != "text":
        raise untranslatable(path, TO_ANTHROPIC, f"a {part.get('type')!r} part here")
    _only(part, path, {"type", "text", "cache_control"})
    return _cached({"type": "text", "text": part.get("text", "")}, part)


def _cached(block: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    if part.get("cache_control") is not None:
        block["cache_control"] = part["cache_control"]
    return block


def _only(part: dict[str, Any], path: str, keys: set[str]) -> None:
    for key, value in part.items():
        if key not in keys and value is not None:
            raise untranslatable(f"{path}.{key}", TO_ANTHROPIC)


def _image_source(image: dict[str, Any], path: str) -> dict[str, Any]:
    if image.get("detail") not in (None, "auto", "high"):
        # Anthropic reads every image at its full resolution: "low" would answer otherwise.
        raise untranslatable(f"{path}.image_url.detail", TO_ANTHROPIC, repr(image["detail"]))
    url = str(image.get("url", ""))
    if url.startswith("data:"):
        media_type, data = _data_url(url, f"{path}.image_url.url")
        if media_type not in IMAGE_TYPES:
            raise untranslatable(f"{path}.image_url.url", TO_ANTHROPIC, f"a {media_type} image")
        return {"type": "base64", "media_type": media_type, "data": data}
    return {"type": "url", "url": url}


def _document(file: dict[str, Any], path: str) -> dict[str, Any]:
    if file.get("file_id") is not None or not isinstance(file.get("file_data"), str):
        raise untranslatable(f"{path}.file.file_id", TO_ANTHROPIC,
                             "an uploaded file's id is the provider's own")
    media_type, data = _data_url(file["file_data"], f"{path}.file.file_data")
    if media_type != "application/pdf":
        raise untranslatable(f"{path}.file.file_data", TO_ANTHROPIC, f"a {media_type} file")
    block: dict[str, Any] = {"type": "document", "source": {
        "type": "base64", "media_type": media_type, "data": data}}
    if file.get("filename"):
        block["title"] = file["filename"]
    return block


def _data_url(url: str, path: str) -> tuple[str, str]:
    head, _, data = url.partition(",")
    media_type, _, encoding = head.removeprefix("data:").partition(";")
    if encoding != "base64" or not data:
        raise untranslatable(path, TO_ANTHROPIC, "a data URL that is not base64")
    return media_type, data


def _assistant_content(message: dict[str, Any], path: str) -> Any:
    content, calls = message.get("content"), message.get("tool_calls") or []
    if message.get("refusal"):
        raise untranslatable(f"{path}.refusal", TO_ANTHROPIC)
    if not calls and not isinstance(content, list):
        return content
    blocks: list[dict[str, Any]] = []
    if isinstance(content, str) and content:
        blocks.append({"type": "text", "text": content})
    elif isinstance(content, list):
        blocks += [_text_block(p, f"{path}.content[{n}]") for n, p in enumerate(content)]
    for n, call in enumerate(calls):
        blocks.append(_tool_use(call, f"{path}.tool_calls[{n}]"))
    return blocks


def _tool_use(call: dict[str, Any], path: str) -> dict[str, Any]:
    function = call.get("function") or {}
    if call.get("type", "function") != "function":
        raise untranslatable(path, TO_ANTHROPIC, f"a {call.get('type')!r} tool call")
    try:
        arguments = orjson.loads(function.get("arguments") or "{}")
    except orjson.JSONDecodeError:
        arguments = None
    if not isinstance(arguments, dict):
        raise untranslatable(f"{path}.function.arguments", TO_ANTHROPIC,
                             "not a JSON object: Anthropic's tool input is one")
    return {"type": "tool_use", "id": call.get("id"), "name": function.get("name"),
            "input": arguments}


def _tool_result(message: dict[str, Any], path: str) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, list):
        content = [_text_block(p, f"{path}.content[{n}]") for n, p in enumerate(content)]
    return {"type": "tool_result", "tool_use_id": message.get("tool_call_id"),
            "content": content}


def tools(definitions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI function tools as Anthropic's custom tools (`strict` kept: both constrain
    the arguments to the schema)."""
    out = []
    for index, tool in enumerate(definitions):
        path = f"body.tools[{index}]"
        if tool.get("type") != "function":
            raise untranslatable(path, TO_ANTHROPIC, f"a {tool.get('type')!r} tool")
        _only(tool, path, {"type", "function", "cache_control"})
        function = tool.get("function") or {}
        _only(function, f"{path}.function", {"name", "description", "parameters", "strict"})
        made: dict[str, Any] = {"name": function.get("name")}
        if function.get("description") is not None:
            made["description"] = function["description"]
        made["input_schema"] = function.get("parameters") or {"type": "object",
                                                              "properties": {}}
        if function.get("strict") is not None:
            made["strict"] = function["strict"]
        out.append(_cached(made, tool))
    return out


def tool_choice(choice: Any, parallel: Any) -> dict[str, Any] | None:
    """OpenAI's tool_choice and parallel_tool_calls as Anthropic's one tool_choice."""
    if choice == "none":
        return {"type": "none"}
    if choice is None or choice == "auto":
        made: dict[str, Any] = {"type": "auto"}
    elif choice == "required":
        made = {"type": "any"}
    elif isinstance(choice, dict) and choice.get("type") == "function":
        made = {"type": "tool", "name": (choice.get("function") or {}).get("name")}
    else:
        raise untranslatable("body.tool_choice", TO_ANTHROPIC, repr(choice))
    if parallel is False:
        made["disable_parallel_tool_use"] = True
    elif choice is None:
        return None  # nothing asked: Anthropic's default is OpenAI's
    return made

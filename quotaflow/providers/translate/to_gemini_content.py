"""OpenAI chat messages and content parts as Gemini's contents, parts and systemInstruction.

System and developer messages at the start become `systemInstruction` (one text part
each part given); `assistant` turns become `model` turns, their `tool_calls`
`functionCall` parts; a `tool` message becomes a `functionResponse` part in a user
turn (consecutive ones share it), named after the call it answers, since Gemini pairs
a response with its call by the function's name. Images, PDFs and audio given as
base64 data go inline (`inlineData`); an http(s) URL fails the line naming it, as
Gemini does not fetch them. `cache_control` on a part is dropped: Gemini caches
prompts by itself (explicit caches are objects of their own, not part of a request).
"""

from collections.abc import Set as AbstractSet
from typing import Any

import orjson

from quotaflow.providers.translate.gemini_schema import gemini_untranslatable as refuse

# The image types Gemini reads inline, by its documentation.
IMAGE_TYPES = ("image/png", "image/jpeg", "image/webp", "image/heic", "image/heif")
AUDIO_TYPES = {"wav": "audio/wav", "mp3": "audio/mp3"}
_ALLOWED = {"system": {"role", "content"}, "developer": {"role", "content"},
            "user": {"role", "content"},
            "assistant": {"role", "content", "tool_calls"},
            "tool": {"role", "content", "tool_call_id"}}


def convert_messages(messages: list[dict[str, Any]]
                     ) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(systemInstruction or None, contents) of an OpenAI messages list."""
    system: list[dict[str, Any]] = []
    contents: list[dict[str, Any]] = []
    calls: dict[str, str] = {}  # tool call id -> function name, for the responses
    results: list[dict[str, Any]] | None = None  # the user turn tool messages fill
    for index, message in enumerate(messages):
        path = f"body.messages[{index}]"
        role = message.get("role")
        if role not in _ALLOWED:
            raise refuse(f"{path}.role", f"role {role!r}")
        for key, value in message.items():
            if key not in _ALLOWED[role] and value is not None:
                raise refuse(f"{path}.{key}")
        if role in ("system", "developer"):
            if contents:
                raise refuse(path, "a system message after the conversation started")
            system += _text_parts(message.get("content"), path)
            continue
        if role == "tool":
            if results is None:
                results = []
                contents.append({"role": "user", "parts": results})
            results.append(_function_response(message, calls, path))
            continue
        results = None
        if role == "user":
            contents.append({"role": "user", "parts": _user_parts(message.get("content"), path)})
        else:
            contents.append({"role": "model", "parts": _model_parts(message, calls, path)})
    return ({"parts": system} if system else None), contents


def _text_parts(content: Any, path: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"text": content}]
    parts = []
    for n, part in enumerate(content or ()):
        where = f"{path}.content[{n}]"
        if part.get("type") != "text":
            raise refuse(where, f"a {part.get('type')!r} part here")
        _only(part, where, {"type", "text", "cache_control"})
        parts.append({"text": part.get("text", "")})
    return parts


def _user_parts(content: Any, path: str) -> list[dict[str, Any]]:
    if not isinstance(content, list):
        return [{"text": "" if content is None else content}]
    return [_part(part, f"{path}.content[{n}]") for n, part in enumerate(content)]


def _part(part: dict[str, Any], path: str) -> dict[str, Any]:
    kind = part.get("type")
    if kind == "text":
        _only(part, path, {"type", "text", "cache_control"})
        return {"text": part.get("text", "")}
    _only(part, path, {"type", kind, "cache_control"})
    if kind == "image_url":
        return _image(part.get("image_url") or {}, path)
    if kind == "file":
        return _file(part.get("file") or {}, path)
    if kind == "input_audio":
        audio = part.get("input_audio") or {}
        mime = AUDIO_TYPES.get(str(audio.get("format")))
        if mime is None:
            raise refuse(f"{path}.input_audio.format", repr(audio.get("format")))
        return {"inlineData": {"mimeType": mime, "data": audio.get("data", "")}}
    raise refuse(path, f"a {kind!r} content part")


def _only(part: dict[str, Any], path: str, keys: AbstractSet[str | None]) -> None:
    for key, value in part.items():
        if key not in keys and value is not None:
            raise refuse(f"{path}.{key}")


def _image(image: dict[str, Any], path: str) -> dict[str, Any]:
    if image.get("detail") not in (None, "auto", "high"):
        # Gemini reads an image at its own resolution: "low" would answer otherwise.
        raise refuse(f"{path}.image_url.detail", repr(image["detail"]))
    url = str(image.get("url", ""))
    where = f"{path}.image_url.url"
    if not url.startswith("data:"):
        raise refuse(where, "an image URL: Gemini takes images inline; send it as a base64 "
                            "data URL")
    mime, data = _data_url(url, where)
    if mime not in IMAGE_TYPES:
        raise refuse(where, f"a {mime} image")
    return {"inlineData": {"mimeType": mime, "data": data}}


def _file(file: dict[str, Any], path: str) -> dict[str, Any]:
    if file.get("file_id") is not None or not isinstance(file.get("file_data"), str):
        raise refuse(f"{path}.file.file_id", "an uploaded file's id is the provider's own")
    mime, data = _data_url(file["file_data"], f"{path}.file.file_data")
    if mime != "application/pdf":
        raise refuse(f"{path}.file.file_data", f"a {mime} file")
    # The filename is not sent: Gemini's inline data has no name for the model to read.
    return {"inlineData": {"mimeType": mime, "data": data}}


def _data_url(url: str, path: str) -> tuple[str, str]:
    head, _, data = url.partition(",")
    mime, _, encoding = head.removeprefix("data:").partition(";")
    if encoding != "base64" or not data:
        raise refuse(path, "a data URL that is not base64")
    return mime, data


def _model_parts(message: dict[str, Any], calls: dict[str, str], path: str
                 ) -> list[dict[str, Any]]:
    content = message.get("content")
    parts = [p for p in _text_parts(content, path) if p["text"]] if content else []
    for n, call in enumerate(message.get("tool_calls") or ()):
        where = f"{path}.tool_calls[{n}]"
        if call.get("type", "function") != "function":
            raise refuse(where, f"a {call.get('type')!r} tool call")
        function = call.get("function") or {}
        try:
            arguments = orjson.loads(function.get("arguments") or "{}")
        except orjson.JSONDecodeError:
            arguments = None
        if not isinstance(arguments, dict):
            raise refuse(f"{where}.function.arguments",
                         "not a JSON object: Gemini's function call args are one")
        calls[str(call.get("id"))] = str(function.get("name"))
        parts.append({"functionCall": {"name": function.get("name"), "args": arguments}})
    return parts or [{"text": ""}]


def _function_response(message: dict[str, Any], calls: dict[str, str], path: str
                       ) -> dict[str, Any]:
    name = calls.get(str(message.get("tool_call_id")))
    if name is None:
        raise refuse(f"{path}.tool_call_id",
                     "answers no earlier tool call: Gemini names a response by its call")
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p["text"] for p in _text_parts(content, path))
    return {"functionResponse": {"name": name,
                                 "response": {"content": "" if content is None else content}}}

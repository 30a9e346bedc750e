"""The checks of a /v1/responses or /v1/moderations line's body (formats.py asks).

Each answers the first problem as the reason shown for the line, naming the field by
its path (`body.input[2].content[0].image_url`), or None: a provider would refuse such
a line anyway, and quotaflow refuses it before it costs a call. What is not checked
(a model's own options) goes to the provider as written.
"""

from typing import Any

# Content parts a /v1/responses message may hold, and the field each one needs.
_RESPONSE_PARTS = {"input_text": ("text",), "output_text": ("text",), "refusal": ("refusal",),
                   "input_image": ("image_url", "file_id"),
                   "input_file": ("file_data", "file_id", "file_url")}
_DETAILS = ("low", "high", "auto")


def responses_problem(body: dict[str, Any]) -> str | None:
    """`input` (a string or a list of input items), `instructions`, max_output_tokens."""
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        return "body.instructions must be a string"
    value = body.get("max_output_tokens")
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                              or value <= 0):
        return "body.max_output_tokens must be a positive integer"
    items = body.get("input")
    if isinstance(items, str):
        return None
    if not isinstance(items, list) or not items:
        return ("body.input is required for /v1/responses: a string or a non-empty list of "
                "input items")
    for index, item in enumerate(items):
        problem = _item_problem(f"body.input[{index}]", item)
        if problem:
            return problem
    return None


def _item_problem(path: str, item: Any) -> str | None:
    if not isinstance(item, dict):
        return f"{path} must be an object (a message with role and content, or a typed item)"
    if "role" not in item:
        kind = item.get("type")
        if not isinstance(kind, str) or kind == "message":
            return (f"{path} must be a message (role: user, assistant, system or developer, "
                    "and content) or a typed item such as function_call_output")
        return None
    if not isinstance(item["role"], str):
        return f"{path}.role must be a string"
    content = item.get("content")
    if isinstance(content, str):
        return None
    if not isinstance(content, list) or not content:
        return f"{path}.content must be a string or a non-empty list of content parts"
    for index, part in enumerate(content):
        problem = _response_part_problem(f"{path}.content[{index}]", part)
        if problem:
            return problem
    return None


def _response_part_problem(path: str, part: Any) -> str | None:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind not in _RESPONSE_PARTS:
        return (f"{path} must be a content part with type "
                f"{', '.join(_RESPONSE_PARTS)}; got {_shown(kind)}")
    fields = _RESPONSE_PARTS[kind]
    if not any(isinstance(part.get(name), str) and part[name] for name in fields):
        return f"{path} ({kind}) needs {' or '.join(fields)} as a non-empty string"
    if kind == "input_image" and part.get("detail") not in (None, *_DETAILS):
        return f"{path}.detail must be one of {', '.join(_DETAILS)}"
    return None


def moderations_problem(body: dict[str, Any]) -> str | None:
    """`input`: a string, a list of strings, or a list of text and image_url parts."""
    value = body.get("input")
    if isinstance(value, str):
        return None
    if not isinstance(value, list) or not value:
        return ("body.input is required for /v1/moderations: a string, a list of strings, "
                "or a list of {type: text|image_url} parts")
    if all(isinstance(entry, str) for entry in value):
        return None
    for index, part in enumerate(value):
        problem = _moderation_part_problem(f"body.input[{index}]", part)
        if problem:
            return problem
    return None


def _moderation_part_problem(path: str, part: Any) -> str | None:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text":
        return None if isinstance(part.get("text"), str) else f"{path}.text must be a string"
    if kind == "image_url":
        image = part.get("image_url")
        if isinstance(image, dict) and isinstance(image.get("url"), str) and image["url"]:
            return None
        return f"{path}.image_url must be an object with a url"
    return (f"{path} must be a {{type: text, text}} or {{type: image_url, image_url: {{url}}}} "
            f"part (strings and parts are not mixed); got {_shown(part)}")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

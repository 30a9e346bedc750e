"""What ingest stores beside an Anthropic line's params: a view in OpenAI's chat shape.

Routing (`model`), the token count at ingest and admission (quotaflow/budget/tokens.py reads
`messages`, `max_tokens`) and the estimate read a stored body in OpenAI's shape; the
view gives them one without translating anything that could fail: text stays text,
an image becomes an `image_url` part (so it is counted as an image, not as base64
characters), and every other block (tool calls and results, documents, thinking) is
counted as its JSON. It is never sent: an anthropic deployment sends the params as
written, an OpenAI-compatible one their translation (quotaflow/providers/translate/to_openai.py).
"""

import json
from typing import Any


def counting_view(params: dict[str, Any]) -> dict[str, Any]:
    """model, max_tokens and messages (system first) for routing and counting."""
    messages: list[dict[str, Any]] = []
    system = params.get("system")
    if system:
        messages.append({"role": "system", "content": _content(system)})
    for message in params["messages"]:
        messages.append({"role": message["role"], "content": _content(message["content"])})
    view: dict[str, Any] = {"max_tokens": params["max_tokens"], "messages": messages}
    if "model" in params:
        view["model"] = params["model"]
    return view


def _content(content: Any) -> Any:
    if not isinstance(content, list):
        return content
    if all(block.get("type") == "text" for block in content):
        return "".join(str(block.get("text", "")) for block in content)
    return [_part(block) for block in content]


def _part(block: dict[str, Any]) -> dict[str, Any]:
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": str(block.get("text", ""))}
    source = block.get("source") if kind == "image" else None
    if isinstance(source, dict) and source.get("type") in ("base64", "url"):
        url = (source.get("url") if source["type"] == "url"
               else f"data:{source.get('media_type')};base64,{source.get('data')}")
        return {"type": "image_url", "image_url": {"url": url}}
    return {"type": "text", "text": json.dumps(block, ensure_ascii=False)}

"""The simulated provider's answers on /v1/responses and /v1/moderations, shaped as
OpenAI's (quotaflow/providers/mock.py answers the other endpoints and dispatches here).

A Response object's text is "simulated reply to: " + the last user text, cut to
max_output_tokens, with `usage` as the Responses API writes it (input_tokens,
output_tokens, their details, total_tokens). A moderation answer has one result per
input string (one for a list of parts), flagged where the text names a category
(e.g. "violence"), and no `usage`: OpenAI's moderations report none and cost nothing.
"""

import hashlib
import re
import time
import uuid
from typing import Any

from quotaflow.budget.tokens import estimate_tokens, prompt_tokens
from quotaflow.constants import ENDPOINT_RESPONSES

SIMULATED_FINGERPRINT = "quotaflow-simulated"
MODERATION_MODEL = "omni-moderation-latest"
# omni-moderation's categories, and those it also judges on images.
CATEGORIES = ("harassment", "harassment/threatening", "hate", "hate/threatening", "illicit",
              "illicit/violent", "self-harm", "self-harm/intent", "self-harm/instructions",
              "sexual", "sexual/minors", "violence", "violence/graphic")
_NAMED = {name: re.compile(rf"\b{re.escape(name)}\b") for name in CATEGORIES}
IMAGE_CATEGORIES = frozenset({"self-harm", "self-harm/intent", "self-harm/instructions",
                              "sexual", "violence", "violence/graphic"})


def response_text(body: dict[str, Any]) -> str:
    """The last user message's text (the input itself when it is a string)."""
    value = body.get("input", "")
    if isinstance(value, str):
        return value
    for item in reversed(value):
        if isinstance(item, dict) and item.get("role") == "user":
            content = item.get("content")
            if isinstance(content, str):
                return content
            return "".join(str(part.get("text", "")) for part in content or []
                           if isinstance(part, dict) and part.get("type") == "input_text")
    return ""


def response_body(body: dict[str, Any]) -> dict[str, Any]:
    """A complete Response object (`object: "response"`, status completed)."""
    text = f"simulated reply to: {response_text(body)}"
    limit = body.get("max_output_tokens")
    if isinstance(limit, int):
        text = text[: limit * 4]
    input_tokens = prompt_tokens(ENDPOINT_RESPONSES, body)
    output_tokens = estimate_tokens(text)
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": limit,
        "model": body.get("model") or "mock",
        "output": [{"type": "message", "id": f"msg_{uuid.uuid4().hex}", "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}],
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": output_tokens,
                  "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": input_tokens + output_tokens},
        "user": None,
        "metadata": body.get("metadata") or {},
        "system_fingerprint": SIMULATED_FINGERPRINT,
    }


def moderation_body(body: dict[str, Any]) -> dict[str, Any]:
    """A moderation object (`modr-...`): one result per input string, or one for a list
    of text and image parts."""
    value = body.get("input", "")
    if isinstance(value, str):
        inputs: list[tuple[str, bool]] = [(value, False)]
    elif all(isinstance(entry, str) for entry in value):
        inputs = [(entry, False) for entry in value]
    else:
        text = " ".join(str(p.get("text", "")) for p in value
                        if isinstance(p, dict) and p.get("type") == "text")
        images = any(isinstance(p, dict) and p.get("type") == "image_url" for p in value)
        inputs = [(text, images)]
    return {"id": f"modr-{uuid.uuid4().hex[:24]}", "model": body.get("model") or MODERATION_MODEL,
            "results": [_moderation_result(text, images) for text, images in inputs]}


def _moderation_result(text: str, images: bool) -> dict[str, Any]:
    """Flagged where the text names a category; the other scores small and a pure
    function of the text."""
    lowered = text.lower()
    digest = hashlib.sha256(text.encode()).digest()
    scores = {name: (0.97 if _NAMED[name].search(lowered) else digest[i] / 255 / 100)
              for i, name in enumerate(CATEGORIES)}
    flags = {name: score > 0.5 for name, score in scores.items()}
    applied = {name: (["text", "image"] if images and name in IMAGE_CATEGORIES else ["text"])
               for name in CATEGORIES}
    return {"flagged": any(flags.values()), "categories": flags, "category_scores": scores,
            "category_applied_input_types": applied}

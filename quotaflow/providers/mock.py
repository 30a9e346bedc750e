"""The simulated provider: answers derived from the request, no model involved.

Used by the embedded quick start, by the tests and by `quotaflow
mock-provider`. Every answer says it is simulated (model "mock",
system_fingerprint "quotaflow-simulated") and its text is a pure function of
the request, so a test can check that each result belongs to its input.
"""

import hashlib
import json
import time
import uuid
from typing import Any

from quotaflow.budget.tokens import estimate_tokens, prompt_text, prompt_tokens
from quotaflow.constants import (
    ENDPOINT_COMPLETIONS,
    ENDPOINT_EMBEDDINGS,
    ENDPOINT_MODERATIONS,
    ENDPOINT_RESPONSES,
)
from quotaflow.providers.base import ProviderResponse, usage_of
from quotaflow.providers.mock_answers import SIMULATED_FINGERPRINT, moderation_body, response_body

EMBEDDING_DIMENSIONS = 8


def simulated_text(url: str, body: dict[str, Any]) -> str:
    """The reply text: 'simulated reply to: ' + the last user text, cut to max_tokens."""
    if url == ENDPOINT_COMPLETIONS:
        source = prompt_text(url, body)
    else:
        users = [m for m in body.get("messages", []) if m.get("role") == "user"]
        content = users[-1].get("content") if users else ""
        source = content if isinstance(content, str) else json.dumps(content)
    text = f"simulated reply to: {source}"
    limit = body.get("max_tokens") or body.get("max_completion_tokens")
    return text[: limit * 4] if isinstance(limit, int) else text


def simulated_body(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """A complete OpenAI-shaped response body for the request: a chat.completion,
    text_completion, embeddings list, Response or moderation object."""
    if url == ENDPOINT_RESPONSES:
        return response_body(body)
    if url == ENDPOINT_MODERATIONS:
        return moderation_body(body)
    model = body.get("model") or "mock"
    prompt = prompt_tokens(url, body)
    created = int(time.time())
    if url == ENDPOINT_EMBEDDINGS:
        digest = hashlib.sha256(prompt_text(url, body).encode()).digest()
        vector = [b / 255 for b in digest[:EMBEDDING_DIMENSIONS]]
        return {
            "object": "list",
            "model": model,
            "data": [{"object": "embedding", "index": 0, "embedding": vector}],
            "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
        }
    text = simulated_text(url, body)
    completion_tokens = estimate_tokens(text)
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt + completion_tokens,
    }
    if url == ENDPOINT_COMPLETIONS:
        choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": "stop"}
        kind = "text_completion"
    else:
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "finish_reason": "stop"}
        kind = "chat.completion"
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": kind,
        "created": created,
        "model": model,
        "system_fingerprint": SIMULATED_FINGERPRINT,
        "choices": [choice],
        "usage": usage,
    }


class MockProvider:
    """In-process simulated provider: no network, instant answers."""

    async def send(self, url: str, body: dict[str, Any]) -> ProviderResponse:
        response = simulated_body(url, body)
        prompt, completion, cached = usage_of(response)  # responses: input/output_tokens
        return ProviderResponse(
            status_code=200,
            body=response,
            request_id=f"req_{uuid.uuid4().hex[:24]}",
            prompt_tokens=prompt,
            completion_tokens=completion,
            cached_tokens=cached,
        )

    async def aclose(self) -> None:
        return None

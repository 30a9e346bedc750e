"""Token counts the way providers count them at admission.

OpenAI admits a request against TPM by about characters / 4 of the prompt
plus max_tokens (the most the reply may use); the real count arrives later in
`usage`. The limiter and the mock provider both count with these functions.
"""

import json
from typing import Any

from quotaflow.constants import ENDPOINT_COMPLETIONS, ENDPOINT_EMBEDDINGS


def estimate_tokens(text: str) -> int:
    """About four characters a token, at least one."""
    return max(1, (len(text) + 3) // 4)


def prompt_text(url: str, body: dict[str, Any]) -> str:
    """The text a request sends, flattened: what its prompt tokens are counted from."""
    if url == ENDPOINT_EMBEDDINGS:
        value = body.get("input", "")
        return value if isinstance(value, str) else json.dumps(value)
    if url == ENDPOINT_COMPLETIONS:
        value = body.get("prompt", "")
        return value if isinstance(value, str) else json.dumps(value)
    parts = []
    for message in body.get("messages", []):
        content = message.get("content")
        parts.append(content if isinstance(content, str) else json.dumps(content))
    return "\n".join(parts)


def max_output_tokens(body: dict[str, Any], default: int) -> int:
    """The reply's token ceiling: max_completion_tokens, max_tokens, or the default."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return default


def admission_tokens(url: str, body: dict[str, Any], default_max_tokens: int) -> int:
    """Tokens a provider charges against TPM when it admits the request."""
    prompt = estimate_tokens(prompt_text(url, body))
    if url == ENDPOINT_EMBEDDINGS:
        return prompt
    return prompt + max_output_tokens(body, default_max_tokens)

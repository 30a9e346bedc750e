"""What every provider offers the executor: send one request, get one response."""

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(slots=True)
class ProviderResponse:
    """A provider's successful answer with the usage it reported. Not frozen: one is made
    per call, and a frozen dataclass, setting each field through object.__setattr__,
    costs several times as much to build; nothing changes one once made."""

    status_code: int
    body: dict[str, Any]
    request_id: str | None
    prompt_tokens: int
    completion_tokens: int
    # What the provider says is left of its limits (x-ratelimit-remaining-*), if it says.
    remaining_requests: float | None = None
    remaining_tokens: float | None = None
    # Prompt tokens served from the provider's cache (billed at the cached price), and
    # written to it (Anthropic's cache_creation_input_tokens, billed at the cache-write
    # price; the 1-hour ones their part): all of them part of prompt_tokens.
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0
    # The body exactly as the provider sent it, where there is one: stored as is.
    raw: bytes | None = None
    # A split budget's input tokens left (anthropic-ratelimit-input-tokens-remaining);
    # remaining_tokens is then the output tokens'.
    remaining_input_tokens: float | None = None
    # The shape of `body`: "openai" (a chat.completion etc.) or "anthropic" (a Message).
    answer_format: str = "openai"


class Provider(Protocol):
    """A model endpoint. Raises RetryableProviderError or PermanentProviderError on failure."""

    async def send(self, url: str, body: dict[str, Any]) -> ProviderResponse: ...

    async def aclose(self) -> None: ...


def usage_of(body: dict[str, Any]) -> tuple[int, int, int]:
    """(prompt_tokens, completion_tokens, cached_tokens) from an OpenAI-shaped response
    body (cached: usage.prompt_tokens_details.cached_tokens, or input_tokens_details')."""
    usage = body.get("usage") or {}
    prompt = usage.get("prompt_tokens") or usage.get("input_tokens") or 0
    completion = usage.get("completion_tokens") or usage.get("output_tokens") or 0
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
    cached = (details.get("cached_tokens") or 0) if isinstance(details, dict) else 0
    return int(prompt), int(completion), int(cached)

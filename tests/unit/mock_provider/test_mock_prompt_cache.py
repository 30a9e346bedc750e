"""The strict mock's prompt caching: the usage split Anthropic bills (writes, then reads
within the lifetime, 1-hour writes apart), which the cache prices are proven against in
tests/cluster/test_cache_prices.py."""

from typing import Any

from mock_provider.messages import prompt_of
from mock_provider.prompt_cache import PromptCache
from quotaflow.budget.tokens import estimate_tokens


def body(ttl: str | None = None, **top: Any) -> dict[str, Any]:
    mark: dict[str, Any] = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
    return {"model": "claude", "max_tokens": 8, **top,
            "system": [{"type": "text", "text": "s" * 400, "cache_control": mark}],
            "messages": [{"role": "user", "content": "question"}]}


def test_a_prefix_is_written_once_then_read_until_it_expires() -> None:
    now = [0.0]
    cache = PromptCache(clock=lambda: now[0])
    request = body()
    total = estimate_tokens(prompt_of(request))
    first = cache.usage(request, total)
    assert (first["cache_creation_input_tokens"], first["cache_read_input_tokens"]) == (100, 0)
    assert first["input_tokens"] == total - 100
    assert first["cache_creation"] == {"ephemeral_5m_input_tokens": 100,
                                       "ephemeral_1h_input_tokens": 0}
    now[0] = 299.0
    second = cache.usage(request, total)
    assert (second["cache_creation_input_tokens"], second["cache_read_input_tokens"]) == (0, 100)
    now[0] = 299.0 + 301.0  # the read refreshed it for 5 minutes, which have passed
    assert cache.usage(request, total)["cache_creation_input_tokens"] == 100


def test_one_hour_writes_and_requests_asking_for_no_cache() -> None:
    cache = PromptCache()
    hour = cache.usage(body("1h"), 102)
    assert hour["cache_creation"] == {"ephemeral_5m_input_tokens": 0,
                                      "ephemeral_1h_input_tokens": 100}
    plain = {"model": "claude", "max_tokens": 8,
             "messages": [{"role": "user", "content": "hi"}]}
    assert cache.usage(plain, 1) == {"input_tokens": 1, "cache_creation_input_tokens": 0,
                                     "cache_read_input_tokens": 0}
    # Top-level cache_control caches the whole prompt
    whole = {**plain, "cache_control": {"type": "ephemeral"}}
    assert cache.usage(whole, 1)["cache_creation_input_tokens"] == 1

"""Anthropic's prompt caching as the strict mock answers it: usage split into cache
writes, cache reads and the rest, as the real API bills them.

A request whose system or message blocks carry `cache_control` (or with `cache_control`
at the top level: the whole prompt) has the prompt up to its last such block as its
cached prefix. The first request with a prefix writes it (`cache_creation_input_tokens`,
broken down by lifetime in `cache_creation`: 5 minutes, or an hour where the marker's
`ttl` is "1h"); a later one within that lifetime reads it
(`cache_read_input_tokens`) and refreshes it. `input_tokens` is the rest of the prompt.
Tokens are counted as the judge counts the prompt (about four characters a token), so
the three parts add up to what it admitted. Anthropic's minimum cacheable length is
left out: a short prompt is cached here, so tests stay small.
"""

import hashlib
import threading
import time
from collections.abc import Callable
from typing import Any

from quotaflow.budget.tokens import estimate_tokens

LIFETIMES = {"5m": 300.0, "1h": 3600.0}


def _pieces(body: dict[str, Any]) -> list[tuple[str, Any]]:
    """(text, cache_control) of the prompt's blocks in caching order, each message (and
    the system prompt) ending in a "\n" as the judge's prompt text joins them."""
    pieces: list[tuple[str, Any]] = []
    for content in ([body["system"]] if body.get("system") is not None else []) + [
            m.get("content") for m in body["messages"]]:
        if isinstance(content, list):
            blocks = [b for b in content if isinstance(b, dict)]
            for n, block in enumerate(blocks):
                tail = "\n" if n == len(blocks) - 1 else ""
                pieces.append((str(block.get("text", "")) + tail, block.get("cache_control")))
        else:
            pieces.append((("" if content is None else str(content)) + "\n", None))
    return pieces


def cached_prefix(body: dict[str, Any]) -> tuple[str, str] | None:
    """(prefix text, lifetime) of the request's cached prefix, or None: it asks for none."""
    pieces = _pieces(body)
    marks = [n for n, (_, mark) in enumerate(pieces) if isinstance(mark, dict)]
    if marks:
        last = marks[-1]
        mark = pieces[last][1]
    elif isinstance(body.get("cache_control"), dict):
        last, mark = len(pieces) - 1, body["cache_control"]
    else:
        return None
    text = "".join(text for text, _ in pieces[:last + 1]).removesuffix("\n")
    return text, "1h" if mark.get("ttl") == "1h" else "5m"


class PromptCache:
    """The mock's cache of prefixes: digest -> when it expires."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock, self._lock = clock, threading.Lock()
        self._expiry: dict[bytes, float] = {}
        self.writes = self.reads = 0  # tokens, for tests

    def usage(self, body: dict[str, Any], input_tokens: int) -> dict[str, Any]:
        """The usage fields of the answer to `body`, whose prompt is `input_tokens`."""
        found = cached_prefix(body)
        usage: dict[str, Any] = {"input_tokens": input_tokens,
                                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
        if found is None:
            return usage
        text, lifetime = found
        tokens = min(estimate_tokens(text), input_tokens)
        key = hashlib.blake2b(f"{body.get('model')}\0{text}".encode(), digest_size=16).digest()
        now = self._clock()
        with self._lock:
            hit = self._expiry.get(key, 0.0) > now
            self._expiry[key] = now + LIFETIMES[lifetime]
            if hit:
                self.reads += tokens
            else:
                self.writes += tokens
        usage["input_tokens"] = input_tokens - tokens
        usage["cache_read_input_tokens" if hit else "cache_creation_input_tokens"] = tokens
        usage["cache_creation"] = {
            "ephemeral_5m_input_tokens": 0 if hit or lifetime == "1h" else tokens,
            "ephemeral_1h_input_tokens": tokens if not hit and lifetime == "1h" else 0}
        return usage

"""What the mock provider has seen, for GET /stats.

The limiter and chaos tests assert on the provider's side of the story, not on
quotaflow's own report of itself: how many calls were admitted and refused, how
many bodies arrived more than once (a request paid twice), how many were in
flight when a process died. Both servers answer /stats in the same shape so a
test or benchmark reads either.
"""

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Stats:
    """What the strict server has seen since start or the last reset."""

    requests_total: int = 0
    admitted: int = 0
    rejected_429: int = 0
    tokens_admitted: int = 0
    tokens_refunded: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_admitted_at: float | None = None
    last_admitted_at: float | None = None
    duplicate_bodies: int = 0
    # Admitted calls not yet answered, and the most there ever were at once: how many a
    # crash can catch in flight.
    in_flight: int = 0
    peak_in_flight: int = 0
    # /v1/messages: the input tokens and max_tokens admitted, and the 429s per limit.
    input_tokens_admitted: int = 0
    output_tokens_admitted: int = 0
    limited_by: Counter[str] = field(default_factory=Counter)
    calls_per_body: Counter[str] = field(default_factory=Counter)

    def record_admitted(self, body: dict[str, Any], cost: int) -> None:
        key = json.dumps(body, sort_keys=True)
        if self.calls_per_body[key]:
            self.duplicate_bodies += 1
        self.calls_per_body[key] += 1
        self.admitted += 1
        self.tokens_admitted += cost
        now = time.time()
        if self.first_admitted_at is None:
            self.first_admitted_at = now
        self.last_admitted_at = now

    def record_usage(self, usage: dict[str, Any]) -> None:
        """An answer's usage, in either shape (/v1/responses says input/output_tokens)."""
        self.prompt_tokens += int(usage.get("prompt_tokens") or usage.get("input_tokens") or 0)
        self.completion_tokens += int(usage.get("completion_tokens")
                                      or usage.get("output_tokens") or 0)

    def as_json(self) -> dict[str, Any]:
        fields = {k: v for k, v in vars(self).items() if k != "calls_per_body"}
        return {**fields, "max_calls_per_body": max(self.calls_per_body.values(), default=0)}


@dataclass
class LeanStats:
    """What the unlimited server has seen; kept to a few integer additions per request.

    Repeats are counted by the hash of the raw body bytes, not of a canonical form of
    the JSON: a client that sends one request twice sends the same bytes, and hashing
    bytes costs far less than sorting and serialising the body again. Python's 64-bit
    hash makes a false repeat among a million bodies about a 1-in-10^7 event.
    """

    requests_total: int = 0
    admitted: int = 0
    rejected_429: int = 0  # never, by design; kept so /stats reads like the strict judge's
    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_admitted_at: float | None = None
    last_admitted_at: float | None = None
    duplicate_bodies: int = 0
    calls_per_body: dict[int, int] = field(default_factory=dict)

    def record_admitted(self, raw: bytes, usage: dict[str, Any]) -> None:
        key = hash(raw)
        calls = self.calls_per_body.get(key, 0)
        self.calls_per_body[key] = calls + 1
        self.duplicate_bodies += calls > 0
        self.admitted += 1
        now = time.time()
        if self.first_admitted_at is None:
            self.first_admitted_at = now
        self.last_admitted_at = now
        self.prompt_tokens += usage.get("prompt_tokens") or usage.get("input_tokens") or 0
        self.completion_tokens += (usage.get("completion_tokens")
                                   or usage.get("output_tokens") or 0)

    def as_json(self) -> dict[str, Any]:
        fields = {k: v for k, v in vars(self).items() if k != "calls_per_body"}
        return {**fields, "max_calls_per_body": max(self.calls_per_body.values(), default=0),
                "unlimited": True}

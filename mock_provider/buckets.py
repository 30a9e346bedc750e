"""The strict provider's requests and tokens buckets.

They are written here on purpose and share no code with quotaflow's own limiter
(quotaflow/budget/limiter.py): a judge built from the code it judges would agree with
its bugs. Each bucket refills continuously, holds limit x burst_seconds / 60, and
a request is admitted only if both buckets hold enough, all or nothing, the way
OpenAI counts.

The buckets live in one process's memory behind a lock, so the provider must be
served by one uvicorn worker: several would each enforce the full limit and the
judge would be too lenient.
"""

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

Clock = Callable[[], float]

# Float refill arithmetic can leave a bucket 1e-12 short of a request that a
# client timed exactly by retry-after-ms; forgive that much, never more.
FIT_EPSILON = 1e-9
REQUESTS = "requests"
TOKENS = "tokens"


class TokenBucket:
    """One continuously refilling bucket. Not thread-safe: RateLimits holds the lock."""

    def __init__(self, limit_per_minute: float, burst_seconds: float, now: float) -> None:
        self.capacity = limit_per_minute * burst_seconds / 60
        self.rate = limit_per_minute / 60
        self._level = self.capacity
        self._updated = now

    def level(self, now: float) -> float:
        """The bucket's content at `now`, after refilling since the last look."""
        elapsed = max(0.0, now - self._updated)
        self._level = min(self.capacity, self._level + elapsed * self.rate)
        self._updated = max(self._updated, now)
        return self._level

    def wait_for(self, amount: float, now: float) -> float:
        """Seconds until `amount` fits: 0 if it fits now, inf if it never can."""
        if amount > self.capacity + FIT_EPSILON:
            return math.inf
        deficit = amount - self.level(now)
        return 0.0 if deficit <= FIT_EPSILON else deficit / self.rate

    def take(self, amount: float, now: float) -> None:
        self._level = self.level(now) - amount

    def give(self, amount: float, now: float) -> None:
        """Return tokens (or charge more, if negative), never above capacity."""
        self._level = min(self.capacity, self.level(now) + amount)

    def until_full(self, now: float) -> float:
        """Seconds until the bucket is full again (OpenAI's x-ratelimit-reset-*)."""
        return max(0.0, (self.capacity - self.level(now)) / self.rate)


@dataclass(frozen=True)
class Decision:
    """The outcome of one admission and the bucket state to report in headers."""

    admitted: bool
    limited_by: str | None  # "requests" or "tokens" when refused
    wait_s: float  # until it would fit; until the token bucket is full if it never can
    never_fits: bool
    remaining_requests: float
    remaining_tokens: float
    reset_requests_s: float
    reset_tokens_s: float


class RateLimits:
    """The requests and tokens buckets of one server, admitted together under one lock."""

    def __init__(
        self, rpm: float, tpm: float, burst_seconds: float, clock: Clock = time.monotonic
    ) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        now = clock()
        self.requests = TokenBucket(rpm, burst_seconds, now)
        self.tokens = TokenBucket(tpm, burst_seconds, now)

    def try_admit(self, tokens: float) -> Decision:
        """Take one request and `tokens` if both fit now; otherwise take nothing."""
        with self._lock:
            now = self._clock()
            waits = {
                REQUESTS: self.requests.wait_for(1, now),
                TOKENS: self.tokens.wait_for(tokens, now),
            }
            limited_by = max(waits, key=lambda kind: waits[kind])
            wait = waits[limited_by]
            admitted = wait == 0.0
            if admitted:
                self.requests.take(1, now)
                self.tokens.take(tokens, now)
            never_fits = math.isinf(wait)
            if never_fits:
                wait = max(self.requests.until_full(now), self.tokens.until_full(now))
            return self._decision(now, admitted, None if admitted else limited_by, wait,
                                  never_fits)

    def settle(self, tokens: float) -> Decision:
        """Charge real usage after the answer: refund the unused part of the admission cost."""
        with self._lock:
            now = self._clock()
            self.tokens.give(tokens, now)
            return self._decision(now, True, None, 0.0, False)

    def _decision(self, now: float, admitted: bool, limited_by: str | None, wait: float,
                  never_fits: bool) -> Decision:
        return Decision(
            admitted=admitted,
            limited_by=limited_by,
            wait_s=wait,
            never_fits=never_fits,
            remaining_requests=self.requests.level(now),
            remaining_tokens=self.tokens.level(now),
            reset_requests_s=self.requests.until_full(now),
            reset_tokens_s=self.tokens.until_full(now),
        )

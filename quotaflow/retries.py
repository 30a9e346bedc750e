"""How long to wait before another try at a provider: kept apart from the call itself."""

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter, never shorter than the provider's Retry-After."""

    max_attempts: int = 5
    base_delay_s: float = 0.5
    max_delay_s: float = 30.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        ceiling = min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1))
        backoff = random.uniform(0, ceiling)
        return max(backoff, retry_after or 0.0)

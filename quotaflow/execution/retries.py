"""How long to wait before another try at a provider: kept apart from the call itself."""

import logging
import random
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

# A clamped wait is logged at most this often per deployment (a flood of 429s asking for
# ten minutes would otherwise log every request).
_LOG_EVERY_S = 60.0
_logged_at: dict[str, float] = {}


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter, never shorter than the provider's Retry-After,
    which is itself never believed beyond `max_wait_s`."""

    max_attempts: int = 5
    base_delay_s: float = 0.5
    max_delay_s: float = 30.0
    # The longest wait a provider may ask for (Retry-After, a limit's reset): a 429 saying
    # "retry after 600" would otherwise hold a job for ten minutes; the official SDKs cap
    # it at about a minute. The limiter still protects the budget past it.
    max_wait_s: float = 60.0

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        ceiling = min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1))
        backoff = random.uniform(0, ceiling)
        return max(backoff, retry_after or 0.0)

    def provider_wait(self, asked: float | None, deployment: str) -> float | None:
        """The provider's wait, clamped to `max_wait_s`; a longer one is logged."""
        if asked is None or asked <= self.max_wait_s:
            return asked
        now = time.monotonic()
        if now - _logged_at.get(deployment, -_LOG_EVERY_S) >= _LOG_EVERY_S:
            _logged_at[deployment] = now
            log.warning("deployment %s asked to wait %.0f s before the next try; waiting "
                        "%.0f s (QUOTAFLOW_MAX_RETRY_AFTER_S), the limiter keeps its budget",
                        deployment, asked, self.max_wait_s,
                        extra={"deployment": deployment})
        return self.max_wait_s

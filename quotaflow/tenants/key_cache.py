"""Which tenant an API key acts for, remembered for a few seconds by the process.

Every API request presents a key; looking it up is a query of its own, as costly as the
status read it guards. A process remembers each key it has seen accepted for
`api_key_cache_s`, keyed by the key's digest (the secret itself is never kept), so a
poller's reads cost no lookup; a revoked key stops working within that time. Refused
keys are not remembered: a key made a moment ago works at once.
"""

import time
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from quotaflow.tenants.keys import hash_key, key_grant

# A process sees few distinct keys; past this many, the oldest half is forgotten.
MAX_KEYS = 10_000


class KeyCache:
    """Accepted keys' (tenant, operator) by digest, each for `ttl_s` seconds."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._grants: dict[str, tuple[float, str, bool]] = {}

    def cached(self, secret: str | None) -> tuple[str, bool] | None:
        """The key's (tenant, operator) if it was accepted less than ttl_s ago."""
        if not secret or self.ttl_s <= 0:
            return None
        found = self._grants.get(hash_key(secret))
        if found is None or found[0] <= self.clock():
            return None
        return found[1], found[2]

    def lookup(self, sessions: sessionmaker[Session], secret: str | None) -> tuple[str, bool]:
        """The key's (tenant, operator), from memory or the database; AuthenticationError
        for none, an unknown or a revoked key."""
        known = self.cached(secret)
        if known is not None:
            return known
        with sessions() as session:
            tenant, operator = key_grant(session, secret)
        if self.ttl_s > 0 and secret:
            if len(self._grants) >= MAX_KEYS:
                for digest in list(self._grants)[:MAX_KEYS // 2]:
                    self._grants.pop(digest, None)
            self._grants[hash_key(secret)] = (self.clock() + self.ttl_s, tenant, operator)
        return tenant, operator

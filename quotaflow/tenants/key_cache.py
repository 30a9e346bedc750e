"""Which key is which, remembered for a few seconds by the process; when each was last used.

Every API request presents a key; looking it up is a query of its own, as costly as the
status read it guards. A process remembers each key it has seen accepted for
`api_key_cache_s`, keyed by the key's digest (the secret itself is never kept), so a
poller's reads cost no lookup; a revoked key stops working within that time. Refused
keys are not remembered: a key made a moment ago works at once. Expiry is checked on
every request against the remembered grant, so a key never outlives its time.

`last_used_at` is written at most once a minute per key and process (`touch_due` says
when), off the request's path: a busy key costs one conditional UPDATE a minute, not a
write per request.
"""

import time
from collections.abc import Callable

from sqlalchemy.orm import Session, sessionmaker

from quotaflow.tenants.grants import Grant
from quotaflow.tenants.keys import TOUCH_EVERY, hash_key, key_grant

# A process sees few distinct keys; past this many, the oldest half is forgotten.
MAX_KEYS = 10_000
TOUCH_EVERY_S = TOUCH_EVERY.total_seconds()


class KeyCache:
    """Accepted keys' grants by digest, each for `ttl_s` seconds."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self.wall = wall
        self._grants: dict[str, tuple[float, Grant]] = {}
        self._touched: dict[str, float] = {}

    def cached(self, secret: str | None) -> Grant | None:
        """The key's grant if it was accepted less than ttl_s ago and has not expired
        since (KeyExpired)."""
        if not secret or self.ttl_s <= 0:
            return None
        found = self._grants.get(hash_key(secret))
        if found is None or found[0] <= self.clock():
            return None
        found[1].check_live(self.wall())
        return found[1]

    def renew_due(self, secret: str | None) -> bool:
        """Whether the key is remembered with less than half its ttl_s left: time to look
        it up again ahead of its expiry, so that its requests never all miss at once."""
        if not secret or self.ttl_s <= 0:
            return False
        found = self._grants.get(hash_key(secret))
        return found is not None and found[0] - self.clock() < self.ttl_s / 2

    def lookup(self, sessions: sessionmaker[Session], secret: str | None,
               renew: bool = False) -> Grant:
        """The key's grant, from memory or the database (`renew`: from the database);
        AuthenticationError for none, an unknown or a revoked key, KeyExpired for an
        expired one."""
        known = None if renew else self.cached(secret)
        if known is not None:
            return known
        with sessions() as session:
            grant = key_grant(session, secret)
        if self.ttl_s > 0 and secret:
            if len(self._grants) >= MAX_KEYS:
                for digest in list(self._grants)[:MAX_KEYS // 2]:
                    self._grants.pop(digest, None)
            self._grants[hash_key(secret)] = (self.clock() + self.ttl_s, grant)
        return grant

    def touch_due(self, key_id: str) -> bool:
        """Whether this process should write the key's last_used_at now (and, if so,
        that it will not be asked again for a minute)."""
        now = self.clock()
        last = self._touched.get(key_id)
        if last is not None and now - last < TOUCH_EVERY_S:
            return False
        if len(self._touched) >= MAX_KEYS:
            self._touched.clear()
        self._touched[key_id] = now
        return True

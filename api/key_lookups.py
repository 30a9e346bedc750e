"""Key lookups shared by the requests that present the same key at once.

A process remembers an accepted key for `api_key_cache_s` (quotaflow/tenants/key_cache.py),
and when that time runs out every request of a busy key misses together: a thousand
pollers each sent the same lookup to a thread and a database connection at the same
moment, and the status reads they guard waited behind them for seconds. Here a miss
starts one lookup per key digest and every request arriving meanwhile awaits that one;
the next request after it ends finds the answer remembered (or, for a refused key,
looks again: refusals are not remembered). A key in use is looked up again once half
its time is gone, in the background while its requests are answered from memory, so a
busy key never misses at all; a revoked key still stops working within
`api_key_cache_s`, as the renewal finds it refused and its remembered grant runs out.
"""

import asyncio

from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.tenants.grants import Grant
from quotaflow.tenants.key_cache import KeyCache
from quotaflow.tenants.keys import hash_key


class KeyLookups:
    """The lookups in flight, by the key's digest (the secret itself is never kept)."""

    def __init__(self, cache: KeyCache) -> None:
        self.cache = cache
        self._running: dict[str, asyncio.Future[Grant]] = {}
        self.lookups = 0  # lookups started, for the tests

    async def grant(self, sessions: sessionmaker[Session], key: str | None) -> Grant:
        """The key's grant: remembered, else from the one lookup of it in flight (started
        now when there is none); the lookup's error (401, 503) for every request awaiting it."""
        found = self.remembered(sessions, key)
        if found is not None:
            return found
        # Shielded: a request whose client leaves does not cancel the others' lookup.
        return await asyncio.shield(self._start(sessions, key, renew=False))

    def remembered(self, sessions: sessionmaker[Session], key: str | None) -> Grant | None:
        """The key's remembered grant (None: not remembered), its renewal started in the
        background when due; KeyExpired once it has expired."""
        found = self.cache.cached(key)
        if found is not None and self.cache.renew_due(key):
            self._start(sessions, key, renew=True)  # not awaited: `found` answers now
        return found

    def _start(self, sessions: sessionmaker[Session], key: str | None,
               renew: bool) -> "asyncio.Future[Grant]":
        """The key's lookup in flight, started now if there is none."""
        digest = hash_key(key) if key else ""
        running = self._running.get(digest)
        if running is None:
            self.lookups += 1
            running = asyncio.ensure_future(
                run_in_threadpool(self.cache.lookup, sessions, key, renew))
            self._running[digest] = running
            running.add_done_callback(lambda done: self._done(digest, done))
        return running

    def _done(self, digest: str, done: "asyncio.Future[Grant]") -> None:
        if self._running.get(digest) is done:
            del self._running[digest]
        if not done.cancelled():
            done.exception()  # retrieved: an error nobody awaited any more logs nothing

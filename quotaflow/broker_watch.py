"""Whether the broker (Redis) restarted, so queued messages may be gone.

Workers keep no copy of the queue: PostgreSQL says which items are pending, the
broker holds their messages. A broker that restarts empty (no persistence, a
failover to a fresh replica) loses them, and one restarted from its
append-only file may lose the last ones; either way the reaper must queue the
pending work again at once rather than wait out the queue patience.
"""

import redis

from quotaflow.constants import REDIS_PREFIX

RUN_ID_KEY = f"{REDIS_PREFIX}:broker:run_id"


class BrokerWatch:
    """Notices that the broker restarted: its run id changes with every start.

    The run id last acted on is kept in the broker. One that restarted with its data
    (append-only file) still holds the old id; one that came back empty holds none,
    so every worker that saw the old id marks it as restarted. The reaper holding the
    lock then queues the pending work again and records the new id. A brand-new
    broker (no worker saw another id) is only recorded.
    """

    def __init__(self, broker: redis.Redis) -> None:
        self._broker = broker
        self._seen: str | None = None

    def observe(self) -> None:
        """Every worker, every round: mark a restart this worker saw happen."""
        current = self._broker.info("server")["run_id"]
        if self._seen is not None and current != self._seen:
            self._broker.set(RUN_ID_KEY, "restarted")
        self._seen = current

    def restarted(self) -> bool:
        """Whether pending work must be queued again (asked by the lock holder only)."""
        current = self._broker.info("server")["run_id"]
        stored = self._broker.set(RUN_ID_KEY, current, get=True)
        return stored is not None and stored.decode() != current

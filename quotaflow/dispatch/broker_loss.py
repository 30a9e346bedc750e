"""Whether the broker lost queued messages, however it lost them.

A restart changes the broker's run id (broker_watch.py), but Redis can lose data
while its process lives on: an operator's FLUSHDB, another application's FLUSHALL on
a shared server, eviction under `maxmemory`. The run id stays; only the data is gone.
Two more signs, each checked once a reaper round, catch those:

- a canary key the reaper keeps in the broker's database, with an expiry so that
  `volatile-*` eviction policies consider it too, and touched only once a round, so
  that an LRU policy takes it before the busy queues: missing, data was lost;
- the broker holding no message at all (every list empty, nothing unacked: a message
  a worker holds for its countdown is in `unacked`) while PostgreSQL has pending items,
  at two looks a round apart: their messages are gone, however.

Either way the reaper queues every pending item again at once. A message that
survived only makes a second claim find nothing, so nothing is sent twice.
"""

import time
from typing import cast

import redis
from sqlalchemy import exists, select
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.constants import REDIS_PREFIX
from quotaflow.dispatch.broker_watch import BrokerWatch
from quotaflow.models import Item, ItemStatus, Job, JobStatus

CANARY = f"{REDIS_PREFIX}:broker:canary"
CANARY_TTL_S = 30 * 24 * 3600
# When the broker was first seen holding no message while work was pending (a key in
# the broker itself, so whichever worker's reaper holds the next round reads it).
EMPTY_SINCE = f"{REDIS_PREFIX}:broker:empty-since"
# Kombu's Redis transport keeps messages a worker has taken, and not acknowledged, here.
UNACKED = "unacked"


class BrokerLoss:
    """Asked once a reaper round, by the reaper holding the round's lock."""

    def __init__(self, broker: redis.Redis, sessions: sessionmaker[Session],
                 interval_s: float) -> None:
        self._broker = broker
        self._sessions = sessions
        self._interval_s = interval_s
        self._watch = BrokerWatch(broker, sessions)

    def lost(self) -> str | None:
        """Why every pending item must be queued again now, or None."""
        if self._watch.restarted():
            return "the broker restarted"
        canary = self._broker.set(CANARY, "1", ex=CANARY_TTL_S, get=True)
        if canary is None:
            return "the broker's canary key is gone (flushed, evicted or failed over)"
        if self._messages_lost():
            return "the broker holds no message while items are pending"
        return None

    def _messages_lost(self) -> bool:
        if _holds_messages(self._broker) or not self._pending_work():
            self._broker.delete(EMPTY_SINCE)
            return False
        now = time.time()
        since = float(cast("bytes | None", self._broker.get(EMPTY_SINCE)) or now)
        if since == now:
            self._broker.set(EMPTY_SINCE, repr(now), ex=int(3 * self._interval_s) + 1)
        if now - since >= 0.9 * self._interval_s:
            self._broker.delete(EMPTY_SINCE)
            return True
        return False

    def _pending_work(self) -> bool:
        with self._sessions() as session:
            return bool(session.scalar(select(exists().where(
                Item.is_open, Item.status == ItemStatus.PENDING,
                Item.job_id.in_(select(Job.id).where(Job.status == JobStatus.IN_PROGRESS))))))


def _holds_messages(broker: redis.Redis) -> bool:
    """Any message queued or taken: a list with something in it, or one unacknowledged."""
    if broker.hlen(UNACKED):
        return True
    return any(broker.llen(key) for key in broker.scan_iter(count=1000, _type="list"))

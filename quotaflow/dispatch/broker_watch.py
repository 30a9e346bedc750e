"""Whether the broker (Redis) restarted, so queued messages may be gone.

Workers keep no copy of the queue: PostgreSQL says which items are pending, the
broker holds their messages. A broker that restarts empty (no persistence, a
failover to a fresh replica) loses them, and one restarted from its
append-only file may lose the last ones; either way the reaper must queue the
pending work again at once rather than wait out the queue patience.
"""

from typing import Any, cast

import redis
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from quotaflow import store
from quotaflow.models import BrokerRun, utcnow

BROKER = "broker"


class BrokerWatch:
    """Notices that the broker restarted: its run id changes with every start.

    The run id last acted on is kept in PostgreSQL, which outlives the broker, so
    the reaper holding the round's lock notices a restart whenever it happened:
    before any worker had looked, while every worker was down too, or with the
    broker's data kept or lost. A database that never saw a run id (a new
    install) only records it.
    """

    def __init__(self, broker: redis.Redis, sessions: sessionmaker[Session]) -> None:
        self._broker = broker
        self._sessions = sessions

    def restarted(self) -> bool:
        """Whether pending work must be queued again; asked by one reaper at a time."""
        current = cast("dict[str, Any]", self._broker.info("server"))["run_id"]
        with self._sessions.begin() as session:
            known = session.scalar(select(BrokerRun).where(BrokerRun.name == BROKER)
                                   .with_for_update())
            if known is None:
                session.execute(store.of(session).insert_ignore(BrokerRun.__table__)
                                .values(name=BROKER, run_id=current, seen_at=utcnow()))
                return False
            if known.run_id == current:
                return False
            known.run_id, known.seen_at = current, utcnow()
            return True

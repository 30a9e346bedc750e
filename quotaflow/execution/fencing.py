"""Fencing: a chunk is admitted, and a call sent, only while its item's lease is held.

A worker that stops running for longer than its lease (a paused VM, a long GC or
swap stall, SIGSTOP) wakes up to items the reaper has since given to another worker.
Without a fence it would send them again: the provider answers, and bills, twice.

The lease's row in PostgreSQL is the token. Checking it before every call would cost
a round trip per request, so the run keeps a local deadline instead: the monotonic
time of its last successful renewal's start plus the lease, less a third of it (the
renewals' own beat) and a second (the clocks of the hosts that wrote and read the
expiry differ). Before it, the lease is certainly held; after it (the process was
frozen, or the database was away), every item about to be admitted or sent is
checked, and renewed, in one UPDATE ... RETURNING: the lines it returns are still
this run's, the others belong to whoever took them. Only calls already on the wire
when the worker froze can reach the provider twice.
"""

import logging
import time
from collections.abc import Iterable
from datetime import timedelta

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.models import ItemStatus, utcnow
from quotaflow.results.leases import ITEMS

log = logging.getLogger(__name__)

CLOCK_SKEW_S = 1.0


class Fence:
    """Whether one batch run still holds its items' leases."""

    def __init__(self, sessions: sessionmaker[Session], job_id: str, owner: str,
                 lease: timedelta, claimed_at: float) -> None:
        self.sessions, self.job_id, self.owner, self.lease = sessions, job_id, owner, lease
        self._lease_s = lease.total_seconds()
        self._sure_until = claimed_at + self._margin_s()
        self._doubt = False

    def _margin_s(self) -> float:
        return self._lease_s * 2 / 3 - CLOCK_SKEW_S

    def renewed(self, started: float) -> None:
        """A renewal that began at `started` (monotonic) succeeded. One that began past the
        deadline cannot vouch for the time before it (items may have changed hands
        meanwhile, and it renews only what is still this run's): from then on, every
        admission and call asks the database."""
        if started >= self._sure_until:
            self._doubt = True
        if not self._doubt:
            self._sure_until = max(self._sure_until, started + self._margin_s())

    def sure(self) -> bool:
        """The leases are certainly held now, without asking the database."""
        return not self._doubt and time.monotonic() < self._sure_until

    def held(self, lines: Iterable[int]) -> set[int]:
        """Of these lines, those whose lease this run still holds (renewed now)."""
        wanted = list(lines)
        if not wanted or self.sure():
            return set(wanted)
        with self.sessions.begin() as session:
            kept = set(session.execute(
                update(ITEMS)
                .where(ITEMS.c.job_id == self.job_id, ITEMS.c.line_no.in_(wanted),
                       ITEMS.c.lease_owner == self.owner,
                       ITEMS.c.status == ItemStatus.RUNNING)
                .values(lease_expires_at=utcnow() + self.lease)
                .returning(ITEMS.c.line_no)).scalars())
        self._doubt = True  # past the deadline: ask every time from now on
        if len(kept) < len(wanted):
            log.warning("job %s: %d of %d items' leases passed to another worker while this "
                        "one was stopped; not sending them", self.job_id,
                        len(wanted) - len(kept), len(wanted), extra={"job_id": self.job_id})
        return kept

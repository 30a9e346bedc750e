"""The delivery loop's round: sweep ended jobs into the outbox, then attempt what is due.

Workers run it in a thread of their main process (workers/webhooks.py), beside the
reaper, so it never takes a pool process from batches; attempts of one round run in a
few threads of their own, so one slow endpoint does not hold the others up for long.
"""

import logging
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy.orm import Session, sessionmaker

from quotaflow.config import Settings
from quotaflow.webhooks import outbox, sender

log = logging.getLogger(__name__)

# Attempts at once per worker, and the most a round claims.
CONCURRENCY = 8
CLAIM_LIMIT = 32


class DeliveryLoop:
    """One worker's deliverer; `round` is called every QUOTAFLOW_WEBHOOK_POLL_INTERVAL_S."""

    def __init__(self, sessions: sessionmaker[Session], settings: Settings) -> None:
        self.sessions = sessions
        self.settings = settings
        self.client = sender.make_client(settings)
        self.pool = ThreadPoolExecutor(CONCURRENCY, thread_name_prefix="quotaflow-webhook")
        # A claim outlives the longest attempt by far: it lapses only for a dead worker.
        self.lease_s = settings.webhook_timeout_s * 2 + 5

    def round(self) -> int:
        """Sweep, then make every due attempt; how many attempts were made."""
        schedule = self.settings.webhook_retry_schedule_s
        made = outbox.sweep(self.sessions, schedule[0])
        if made:
            log.info("webhooks: %d deliveries made for ended jobs", made)
        claims = outbox.claim_due(self.sessions, self.lease_s, CLAIM_LIMIT)
        futures = [(claim, self.pool.submit(sender.attempt, self.client, self.settings, claim))
                   for claim in claims]
        for claim, future in futures:
            outcome = future.result()
            status = outbox.record(self.sessions, claim, outcome, schedule)
            level = logging.INFO if outcome.ok else logging.WARNING
            log.log(level, "webhook %s attempt %d to endpoint %s: %s -> %s", claim.id,
                    claim.attempt_no, claim.endpoint_id,
                    outcome.status_code or outcome.error, status)
        return len(claims)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.client.close()

"""Every worker runs the reaper on a timer; a Redis lock lets one of them act per round.

Running it inside the workers (not a separate beat process) means it survives
the loss of any one worker.
"""

import logging
from datetime import timedelta

import redis
from celery.signals import worker_ready
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.compat import retention
from quotaflow.compat.openai_batches import fail_abandoned
from quotaflow.config import get_settings
from quotaflow.constants import REDIS_PREFIX
from quotaflow.dispatch.broker_loss import BrokerLoss
from quotaflow.dispatch.reaper import reap
from quotaflow.jobs.service import expire_overdue
from quotaflow.redis_clients import RedisClient, connect
from quotaflow.runtime import Runtime
from workers import rounds
from workers.dispatch import CeleryDispatcher

log = logging.getLogger(__name__)
LOCK_KEY = f"{REDIS_PREFIX}:reaper:lock"
# A batch validating this long and not held by an ingest was left by a dead API.
ABANDONED_AFTER = timedelta(minutes=5)


def reap_forever() -> None:
    # The reaper's own parts, in the worker's main process (tasks run in its children).
    runtime = Runtime(get_settings(), CeleryDispatcher)
    settings, sessions = runtime.settings, runtime.sessions
    interval = settings.reap_interval_s
    # The lock is on the limiter's Redis, which may be a cluster (made in the loop: one
    # that is down at start must not end the reaper).
    lock: RedisClient | None = None
    broker_url = settings.broker_url
    assert broker_url is not None  # workers/app.py starts no worker without one
    broker = BrokerLoss(redis.Redis.from_url(broker_url), sessions, interval)
    # Queued again where they were first sent: a local deployment's batches to its queues.
    dispatcher = runtime.dispatcher
    # The first round at once, not an interval after start: it records the broker's run
    # id, and a restart can only be noticed against a recorded one.
    delay = 0.0
    # Until the worker shuts down (workers/rounds.py: told by no signal handler).
    while not rounds.pause(delay):
        delay = interval
        try:
            if lock is None:
                lock = connect(settings.limiter_url or broker_url)
            # One reaper per round, cluster-wide; the lock lapses by itself.
            if lock.set(LOCK_KEY, "1", nx=True, px=int(interval * 1000 * 0.9)):
                why = broker.lost()
                if why:
                    log.warning("reaper: %s; queueing every pending item again, as its "
                                "message may be gone", why)
                requeued = reap(sessions, dispatcher, settings.batch_size,
                                timedelta(seconds=settings.queue_patience_s), why is not None)
                if requeued:
                    log.warning("reaper: %d items of dead workers or lost messages queued again",
                                requeued)
                for job_id in expire_overdue(sessions):
                    log.warning("reaper: job %s passed its completion window: expired", job_id)
                _lifecycle(sessions, interval, settings.result_retention_s)
        except Exception:  # a Redis or Postgres outage must not end the reaper
            log.exception("reaper round failed; trying again in %.0fs", interval)


def _lifecycle(sessions: sessionmaker[Session], interval: float, audit_kept_s: int) -> None:
    """Batches left validating by a dead API fail; expired outputs and uploads, and
    deletions cut off, are purged for at most half a round (the rest next round), and
    audit events older than the results' retention are pruned."""
    for job_id in fail_abandoned(sessions, ABANDONED_AFTER):
        log.warning("reaper: batch %s was left validating: failed", job_id)
    swept = retention.sweep(sessions, budget_s=interval / 2, audit_kept_s=audit_kept_s)
    for job_id in swept.expired_jobs:
        log.info("reaper: the output of job %s expired: deleting it", job_id)
    if swept.removed_files or swept.purged_jobs:
        log.info("reaper: removed %d expired files and the rows of %d deleted jobs",
                 swept.removed_files, swept.purged_jobs)


@worker_ready.connect
def start_reaper(**_kwargs: object) -> None:
    rounds.start("quotaflow-reaper", reap_forever)

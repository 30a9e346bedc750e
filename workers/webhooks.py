"""Every worker delivers webhooks from a thread of its main process, like the reaper.

Batches run in the pool's processes, so a slow or dead endpoint never holds one up. The
outbox is in PostgreSQL and claims are SKIP LOCKED, so any number of workers deliver
together without sending a delivery twice, and a worker that dies leaves its claims to
lapse. QUOTAFLOW_WEBHOOK_DELIVERY=false turns it off for one worker; without
QUOTAFLOW_WEBHOOK_SECRET_KEY it cannot sign, so it does not start.
"""

import logging

from celery.signals import worker_ready

from quotaflow.config import get_settings
from quotaflow.errors import QuotaflowError
from quotaflow.runtime import Runtime
from quotaflow.webhooks.delivery_round import CLAIM_LIMIT, DeliveryLoop
from quotaflow.webhooks.signing import master_key
from workers import rounds

log = logging.getLogger(__name__)


def deliver_forever() -> None:
    settings = get_settings()
    loop = DeliveryLoop(Runtime(settings).sessions, settings)
    rounds.run_rounds("webhook", lambda: loop.round() >= CLAIM_LIMIT,
                      settings.webhook_poll_interval_s, loop.close)


@worker_ready.connect
def start_delivery(**_kwargs: object) -> None:
    settings = get_settings()
    if not settings.webhook_delivery:
        log.info("webhook delivery is off in this worker (QUOTAFLOW_WEBHOOK_DELIVERY=false)")
        return
    try:
        master_key(settings.webhook_secret_key)
    except QuotaflowError as exc:
        log.info("webhook delivery is off in this worker: %s", exc)
        return
    rounds.start("quotaflow-webhooks", deliver_forever)

"""Every worker delivers webhooks from a thread of its main process, like the reaper.

Batches run in the pool's processes, so a slow or dead endpoint never holds one up. The
outbox is in PostgreSQL and claims are SKIP LOCKED, so any number of workers deliver
together without sending a delivery twice, and a worker that dies leaves its claims to
lapse. QUOTAFLOW_WEBHOOK_DELIVERY=false turns it off for one worker; without
QUOTAFLOW_WEBHOOK_SECRET_KEY it cannot sign, so it does not start.
"""

import logging
import threading

from celery.signals import worker_ready, worker_shutting_down

from quotaflow.config import get_settings
from quotaflow.errors import QuotaflowError
from quotaflow.runtime import Runtime
from quotaflow.webhooks.loop import CLAIM_LIMIT, DeliveryLoop
from quotaflow.webhooks.signing import master_key

log = logging.getLogger(__name__)
_stop = threading.Event()


def deliver_forever() -> None:
    settings = get_settings()
    loop = DeliveryLoop(Runtime(settings).sessions, settings)
    interval = settings.webhook_poll_interval_s
    delay = 0.0
    try:
        while not _stop.wait(delay):
            delay = interval
            try:
                if loop.round() >= CLAIM_LIMIT:
                    delay = 0.0  # more are due: no pause
            except Exception:  # a Postgres outage must not end the loop
                log.exception("webhook round failed; trying again in %.1fs", interval)
    finally:
        loop.close()


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
    threading.Thread(target=deliver_forever, name="quotaflow-webhooks", daemon=True).start()


@worker_shutting_down.connect
def stop_delivery(**_kwargs: object) -> None:
    _stop.set()

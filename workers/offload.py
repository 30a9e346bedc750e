"""Every worker polls provider batches from a thread of its main process, like the webhook
deliverer (workers/webhooks.py) and the reaper.

Why a loop thread rather than periodic Celery tasks: a poll is a few HTTP round trips
that mostly find nothing new; as tasks they would take pool processes from batches and
pile up behind them in the queues, while a thread beside the pool costs nothing while
it waits. The state is in PostgreSQL (quotaflow/offload/batch_tables.py) and claims are SKIP
LOCKED leases, so any number of workers poll together and a killed worker's provider
batches are resumed by another once its claims lapse.
QUOTAFLOW_PROVIDER_BATCH_LOOP=false turns it off for one worker.
"""

import logging

from celery.signals import worker_ready

from quotaflow.config import get_settings
from quotaflow.offload.poll_round import CLAIM_LIMIT, ProviderBatchLoop
from quotaflow.runtime import Runtime
from workers import rounds
from workers.dispatch import CeleryDispatcher

log = logging.getLogger(__name__)


def poll_forever() -> None:
    settings = get_settings()
    runtime = Runtime(settings, CeleryDispatcher)
    loop = ProviderBatchLoop(runtime.sessions, runtime.deployments, settings,
                             runtime.dispatcher)
    # Twice per poll interval: a batch due now waits half an interval at most.
    interval = min(settings.provider_batch_poll_s, max(0.1, settings.provider_batch_gather_s)) / 2
    rounds.run_rounds("provider batch", lambda: loop.round() >= CLAIM_LIMIT, interval,
                      loop.close)


@worker_ready.connect
def start_polling(**_kwargs: object) -> None:
    settings = get_settings()
    if not settings.provider_batch_loop:
        log.info("provider batch polling is off in this worker (QUOTAFLOW_PROVIDER_BATCH_LOOP"
                 "=false)")
        return
    if not any(d.is_batch for d in settings.load_deployments().deployments.values()):
        return  # no batch deployment: nothing to poll
    rounds.start("quotaflow-provider-batches", poll_forever)

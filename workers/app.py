"""The Celery application, configured for "nothing is lost" (docs/architecture.md,
"Reliability rules").

acks_late + reject_on_worker_lost: a batch whose worker dies goes back to the
queue. Prefetch 1: a busy worker does not sit on batches others could run.
The task time limit stays below the Redis visibility timeout, so a batch that
is still running is never handed to a second worker.
"""

import logging
from typing import Any

from celery import Celery, signals
from kombu import Queue

from quotaflow.config import get_settings
from quotaflow.constants import DEFAULT_QUEUE, QUEUES
from quotaflow.db import end_idle_transactions_after
from quotaflow.errors import ConfigError
from quotaflow.observe import logs


def create_app() -> Celery:
    settings = get_settings()
    if not settings.broker_url:
        raise ConfigError("QUOTAFLOW_BROKER_URL is not set; workers need Redis, "
                          "e.g. QUOTAFLOW_BROKER_URL=redis://127.0.0.1:6379/0")
    # A worker cut off mid-transaction must not hold its locks over the others for hours.
    end_idle_transactions_after(settings.worker_idle_in_transaction_s)
    transport: dict[str, Any] = {"visibility_timeout": settings.visibility_timeout_s}
    if settings.worker_deployment:
        # One worker per GPU takes all of its deployment's priority classes: look at its
        # queues in the order given (realtime first) instead of in turn.
        transport["queue_order_strategy"] = "priority"
    celery = Celery("quotaflow", broker=settings.broker_url,
                    include=["workers.tasks", "workers.reaper", "workers.webhooks",
                             "workers.offload"])
    celery.conf.update(
        task_queues=[Queue(name) for name in QUEUES],
        task_default_queue=DEFAULT_QUEUE,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_time_limit=settings.task_time_limit_s,
        task_soft_time_limit=settings.task_soft_time_limit,
        broker_transport_options=transport,
        broker_connection_retry_on_startup=True,
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        worker_send_task_events=True,
        task_send_sent_event=True,
        worker_hijack_root_logger=False,
    )
    return celery


@signals.setup_logging.connect
def _configure_logging(loglevel: int | str | None = None, **_: Any) -> None:
    """Celery leaves logging to a receiver of this signal: quotaflow's one configuration
    (QUOTAFLOW_LOG_FORMAT), at the worker's --loglevel."""
    logs.configure(get_settings(), loglevel or logging.INFO)


app = create_app()

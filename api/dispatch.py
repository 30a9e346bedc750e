"""Sends batch messages to Celery by task name; the API never imports workers/."""

from celery import Celery

from quotaflow.constants import TASK_PROCESS_BATCH
from quotaflow.errors import ServiceUnavailable
from quotaflow.jobs import BatchRef


class CeleryDispatcher:
    """Publishes one message per batch (job id + line range) on the job's queue."""

    def __init__(self, broker_url: str) -> None:
        self._celery = Celery("quotaflow-api", broker=broker_url)
        self._celery.conf.broker_connection_retry_on_startup = True

    def dispatch(self, queue: str, batches: list[BatchRef]) -> None:
        try:
            with self._celery.producer_or_acquire() as producer:
                for ref in batches:
                    self._celery.send_task(
                        TASK_PROCESS_BATCH, args=[ref.job_id, ref.first_line, ref.last_line],
                        queue=queue, producer=producer)
        except Exception as exc:  # kombu raises many transport-specific types
            raise ServiceUnavailable(
                "could not reach the broker to queue the job's batches "
                f"({exc.__class__.__name__}); check QUOTAFLOW_BROKER_URL and that Redis is running"
            ) from exc

"""The KEDA example against a real Celery producer on the test Redis: each list its
ScaledObject watches is the key Celery fills for that queue (the monitoring files
themselves, checked without a server: tests/unit/project/test_monitoring_config.py)."""

import json

import redis

from quotaflow.dispatch.queues import BatchRef
from tests.unit.project.test_monitoring_config import keda_redis_lists
from workers.dispatch import CeleryDispatcher


def test_keda_redis_lists_are_the_keys_celery_fills(redis_url: str) -> None:
    """The real producer path (what the API runs for a job) on a Redis db of the test's own:
    the key each ScaledObject trigger names holds every message sent to its queue."""
    client = redis.Redis.from_url(redis_url)
    dispatcher = CeleryDispatcher(redis_url)
    for queue in keda_redis_lists():
        # The first batch goes through Celery's send_task, the rest through the pipeline.
        dispatcher.dispatch(queue, [BatchRef("job-1", i * 10, i * 10 + 9) for i in range(3)])
    for queue in keda_redis_lists():
        assert client.type(queue) == b"list", queue
        assert client.llen(queue) == 3, queue
        messages = [json.loads(m) for m in client.lrange(queue, 0, -1)]
        assert {m["properties"]["delivery_info"]["routing_key"] for m in messages} == {queue}
    # No other list got any of them (Celery's priority lists would be named QUEUE\x06\x16N).
    lists = {k.decode() for k in client.keys("*") if client.type(k) == b"list"}
    assert lists == set(keda_redis_lists())

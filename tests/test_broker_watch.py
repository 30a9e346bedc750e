"""The reaper notices a broker restart by its run id, on a Redis of the test's own."""

import redis

from quotaflow.broker_watch import BrokerWatch


def test_a_restart_is_noticed_once_and_a_new_broker_is_not_a_restart(throwaway_redis) -> None:
    url, start, stop = throwaway_redis
    first, second = BrokerWatch(redis.Redis.from_url(url)), BrokerWatch(redis.Redis.from_url(url))
    # Given two workers on a brand-new broker: nothing to queue again
    first.observe()
    second.observe()
    assert not first.restarted()
    assert not second.restarted()
    # When the broker restarts empty
    stop()
    start()
    first.observe()
    second.observe()
    # Then the first reaper to look queues the pending work again, and only it
    assert second.restarted()
    assert not first.restarted()
    # And a round with no restart finds nothing
    first.observe()
    assert not first.restarted()


def test_a_restart_that_kept_its_data_is_noticed_too(throwaway_redis) -> None:
    url, start, stop = throwaway_redis
    client = redis.Redis.from_url(url)
    watch = BrokerWatch(client)
    watch.observe()
    assert not watch.restarted()
    kept = client.get("quotaflow:broker:run_id")
    # When the broker restarts from its append-only file (its keys kept)
    stop()
    start()
    client.set("quotaflow:broker:run_id", kept)  # as restored from disk
    # Then even a reaper that never saw the old run id notices
    assert BrokerWatch(redis.Redis.from_url(url)).restarted()

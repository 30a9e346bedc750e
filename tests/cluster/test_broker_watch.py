"""The reaper notices a broker restart by its run id, and data lost while the broker lived on
by its canary, on a Redis of the test's own."""

import redis

from quotaflow.dispatch.broker_loss import CANARY, BrokerLoss
from quotaflow.dispatch.broker_watch import BrokerWatch


def test_a_restart_is_noticed_once_and_a_new_broker_is_not_a_restart(
        throwaway_redis, pg_sessions) -> None:
    url, start, stop = throwaway_redis
    first = BrokerWatch(redis.Redis.from_url(url), pg_sessions)
    second = BrokerWatch(redis.Redis.from_url(url), pg_sessions)
    # Given a database that never saw a broker: nothing to queue again
    assert not first.restarted()
    assert not second.restarted()
    # When the broker restarts empty, before any reaper looked again
    stop()
    start()
    # Then the first reaper to look queues the pending work again, and only it
    assert second.restarted()
    assert not first.restarted()
    # And a round with no restart finds nothing
    assert not first.restarted()


def test_a_restart_that_kept_its_data_is_noticed_by_a_reaper_that_never_looked(
        throwaway_redis, pg_sessions) -> None:
    url, start, stop = throwaway_redis
    assert not BrokerWatch(redis.Redis.from_url(url), pg_sessions).restarted()
    stop()
    start()
    # A worker started after the restart (its first look) still notices
    assert BrokerWatch(redis.Redis.from_url(url), pg_sessions).restarted()


def test_data_lost_while_the_broker_lives_on_is_noticed_by_its_canary(
        throwaway_redis, pg_sessions) -> None:
    url, _, _ = throwaway_redis
    client = redis.Redis.from_url(url)
    loss = BrokerLoss(client, pg_sessions, interval_s=10.0)
    loss.lost()  # a new install: the canary is laid (queueing pending work again is harmless)
    assert loss.lost() is None
    # The db is flushed (the run id stays): the canary is gone with the messages
    client.flushdb()
    assert "canary" in (loss.lost() or "")
    assert loss.lost() is None
    # Eviction takes the canary alone: noticed too
    client.delete(CANARY)
    assert "canary" in (loss.lost() or "")

"""Lua scripts on a connection each thread holds (quotaflow/redis_scripts.py): the
answers of redis-py's `Script`, one connection per thread, and the pool's recoveries
kept (a restarted Redis, a server that lost its scripts, a forked child)."""

import os
import threading
import time

import pytest
import redis

from quotaflow.budget.buckets import RedisLimiter
from quotaflow.deployments.limits import Budget
from quotaflow.redis_clients import connect
from quotaflow.redis_scripts import HeldScript, load_script

pytestmark = pytest.mark.cluster

COUNT = "return redis.call('INCRBY', KEYS[1], ARGV[1])"


def test_answers_as_redis_py_script_does(redis_url: str) -> None:
    # Given the same script called both ways on the same keys
    client = connect(redis_url)
    held = load_script(client, COUNT)
    pooled = client.register_script(COUNT)
    assert isinstance(held, HeldScript)
    # Then each sees the other's writes, and a Lua error is raised as redis-py raises it
    assert held(keys=["qf:test:n"], args=[2]) == 2
    assert pooled(keys=["qf:test:n"], args=[3]) == 5
    assert held(keys=["qf:test:n"], args=[1]) == 6
    failing = load_script(client, "return redis.error_reply('no such budget')")
    with pytest.raises(redis.ResponseError, match="no such budget"):
        failing()
    assert held(keys=["qf:test:n"], args=[1]) == 7  # the connection is still good


def connections_made(url: str) -> int:
    """How many connections the server has accepted since it started."""
    with redis.Redis.from_url(url) as client:
        return int(client.info("stats")["total_connections_received"])


def test_one_connection_per_thread(throwaway_redis) -> None:
    # Given a script called from four threads, a hundred times each, on a server of our own
    url, _, _ = throwaway_redis
    held = load_script(connect(url), COUNT)
    before = connections_made(url)
    answers: list[list[int]] = [[] for _ in range(4)]

    def calls(mine: list[int]) -> None:
        mine.extend(held(keys=["n"], args=[1]) for _ in range(100))

    threads = [threading.Thread(target=calls, args=(answers[i],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Then every call was answered, and the threads opened one connection each
    # (the count's own connection is the one more)
    assert sorted(n for mine in answers for n in mine) == list(range(1, 401))
    assert connections_made(url) - before == 4 + 1


def test_scripts_lost_or_server_restarted(throwaway_redis) -> None:
    # Given a script whose connection is open
    url, start, stop = throwaway_redis
    held = load_script(connect(url), COUNT)
    assert held(keys=["n"], args=[1]) == 1
    # When the server forgets its scripts: the call loads it again (EVAL) and is answered
    with redis.Redis.from_url(url) as client:
        client.script_flush()
    assert held(keys=["n"], args=[1]) == 2
    # When the server stops: the call fails as the pool's did, with redis-py's error
    stop()
    with pytest.raises(redis.ConnectionError):
        held(keys=["n"], args=[1])
    # When it is back (empty): the next call reconnects by itself
    start()
    assert held(keys=["n"], args=[5]) == 5


SLOW_COUNT = """
local ends = tonumber(redis.call('TIME')[1]) + tonumber(ARGV[1])
while tonumber(redis.call('TIME')[1]) < ends do end
return redis.call('INCR', KEYS[1])
"""


def test_a_call_that_fails_is_not_sent_again(throwaway_redis) -> None:
    # Given a script the server runs for longer than the client waits for an answer
    url, _, _ = throwaway_redis
    held = load_script(connect(url, socket_timeout=0.5), SLOW_COUNT)
    # When the call times out: the error reaches the caller
    with pytest.raises(redis.TimeoutError):
        held(keys=["n"], args=[2])
    # Then the server ran it once, not once more on a new connection (an acquire would
    # have taken its budget twice), and the next call is answered on a fresh connection
    client = redis.Redis.from_url(url)
    for _ in range(60):
        if client.get("n") is not None:
            break
        time.sleep(0.05)
    time.sleep(2.5)  # a second run, had one been sent, would have ended by now
    assert client.get("n") == b"1"
    assert load_script(connect(url), COUNT)(keys=["n"], args=[1]) == 2
    assert held(keys=["n"], args=[0]) == 3


def test_a_forked_child_opens_its_own(throwaway_redis) -> None:
    # Given a script used in this process, then in a forked child
    url, _, _ = throwaway_redis
    held = load_script(connect(url), COUNT)
    assert held(keys=["n"], args=[1]) == 1
    before = connections_made(url)
    pid = os.fork()
    if pid == 0:  # the child: one call, and out without running the parent's cleanup
        code = 0
        try:
            code = 0 if held(keys=["n"], args=[1]) == 2 else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    # Then the child was answered on a connection of its own, and the parent's still works
    assert os.waitstatus_to_exitcode(status) == 0
    assert connections_made(url) - before == 1 + 1
    assert held(keys=["n"], args=[1]) == 3
    assert connections_made(url) - before == 1 + 2  # no new one for the parent


def test_the_limiter_on_held_connections(redis_url: str) -> None:
    # Given the Redis limiter, which calls its script this way
    limiter = RedisLimiter(redis_url)
    budget = Budget("held", rpm=60, tpm=1_000_000)
    # Then admissions are counted across calls as before
    assert limiter.acquire(budget, [10] * 3, 0.0).admitted == 3
    assert limiter.levels(budget).requests == pytest.approx(57, abs=0.1)

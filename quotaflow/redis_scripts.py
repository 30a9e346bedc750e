"""Lua scripts called on a connection each thread holds, not through the client's pool.

The limiter, the fair shares and the circuit breakers make a Lua call for every
chunk a worker admits and every batch of answers it settles. Through redis-py's
`Script`, a call took a connection from the pool and gave it back (with the pool's
locks, checks and wrappers), nearly doubling what the same EVALSHA costs the caller
on a connection the thread holds. So
each thread of a process keeps one connection of its own (a process's threads
each run batches on their own event loop, and a forked child opens its own),
made from the client's own connection settings (address, credentials, TLS,
timeouts).

What the pool did for failures is kept, and no more: before each call the held
connection is checked as the pool checks one it hands out (closed by the server, a
Redis restarted since the last call: a new one is opened); a call that fails is
never sent again (the server may have run it: an acquire would take its budget
twice, a settle refund twice), its connection is dropped, and redis-py's
ConnectionError or TimeoutError goes to the caller, which turns it into
ServiceUnavailable. A server that lost its scripts (restarted, flushed) answers
NOSCRIPT: the script is loaded again and the call repeated. A Redis Cluster keeps
redis-py's `Script`, which routes each call by its key's slot.
"""

import hashlib
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.exceptions import NoScriptError

from quotaflow.redis_clients import RedisClient

Script = Callable[..., Any]
_FAILED = (redis.ConnectionError, redis.TimeoutError, OSError)


def load_script(client: RedisClient, text: str) -> Script:
    """`text` as a callable `script(keys=[...], args=[...])` on `client`'s server."""
    if isinstance(client, redis.Redis):
        return HeldScript(client, text)
    return client.register_script(text)  # type: ignore[misc]  # redis-py types its self as Redis


class HeldScript:
    """A Lua script called with EVALSHA on the calling thread's own connection."""

    def __init__(self, client: redis.Redis, text: str) -> None:
        pool = client.connection_pool
        self._make: Callable[[], redis.Connection] = lambda: pool.connection_class(
            **pool.connection_kwargs)
        self._text = text
        self._sha = hashlib.sha1(text.encode()).hexdigest()
        self._held = threading.local()

    def __call__(self, keys: Sequence[str] = (), args: Sequence[Any] = ()) -> Any:
        connection = self._connection()
        command = ("EVALSHA", self._sha, len(keys), *keys, *args)
        try:
            try:
                return _ask(connection, command)
            except NoScriptError:
                return _ask(connection, ("EVAL", self._text, *command[2:]))
        except _FAILED:  # its answer may still come: this connection cannot be read again
            connection.disconnect()
            raise

    def _connection(self) -> redis.Connection:
        """This thread's connection, made or made again where the pool would have."""
        held = self._held
        connection: redis.Connection | None = getattr(held, "connection", None)
        if connection is None or held.pid != os.getpid():
            connection = held.connection = self._make()
            held.pid = os.getpid()
            return connection  # it connects on its first command
        try:
            if connection.can_read():  # closed by the server, or stray bytes: start afresh
                connection.disconnect()
        except _FAILED:
            connection.disconnect()
        return connection


def _ask(connection: redis.Connection, command: tuple[Any, ...]) -> Any:
    connection.send_command(*command)
    return connection.read_response()

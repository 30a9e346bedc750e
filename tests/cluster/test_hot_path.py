"""The worker's hot path does per chunk what it used to do per request: results go to
PostgreSQL in a few statements per batch, settlements to Redis in one call per
chunk, and a provider's connections outlive the batch that opened them."""

import asyncio
import io
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import event

from quotaflow.budget.buckets import RedisLimiter
from quotaflow.budget.circuit import RedisCircuitBreaker
from quotaflow.budget.limiter import Settlement
from quotaflow.db import get_engine
from quotaflow.deployments.limits import Budget
from quotaflow.dispatch.queues import BatchRef
from quotaflow.execution import BatchExecutor
from quotaflow.ingest import pipeline
from tests.harness.factories import chat_line, jsonl

ANSWER = (b'{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m",'
          b'"choices":[{"index":0,"message":{"role":"assistant","content":"hi"},'
          b'"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,'
          b'"total_tokens":6}}')
RESPONSE = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(ANSWER)).encode() + b"\r\n\r\n" + ANSWER)


class _KeepAliveServer(asyncio.Protocol):
    """Answers every request on a connection with the same completion; counts connections."""

    connections = 0
    transports: list[asyncio.Transport] = []  # noqa: RUF012

    def connection_made(self, transport: asyncio.Transport) -> None:
        type(self).connections += 1
        type(self).transports.append(transport)
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = self.buffer[:end].lower()
            length = int(head.split(b"content-length:")[1].split(b"\r\n")[0])
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length:]
            self.transport.write(RESPONSE)


@pytest.fixture
def counting_provider() -> Iterator[str]:
    """An OpenAI-compatible endpoint on a thread of its own that counts TCP connections."""
    loop = asyncio.new_event_loop()
    _KeepAliveServer.connections = 0
    _KeepAliveServer.transports = []
    server = loop.run_until_complete(loop.create_server(_KeepAliveServer, "127.0.0.1", 0))
    port = server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"

    def close() -> None:
        for transport in _KeepAliveServer.transports:
            transport.close()
        loop.call_later(0.05, loop.stop)

    loop.call_soon_threadsafe(close)
    thread.join(5)
    server.close()
    loop.run_until_complete(server.wait_closed())
    loop.close()


class _Collect:
    def __init__(self) -> None:
        self.batches: list[BatchRef] = []

    def dispatch(self, queue: str, batches: list[BatchRef]) -> None:
        self.batches.extend(batches)


class _CountingLimiter(RedisLimiter):
    settle_calls = 0
    settled = 0

    def settle(self, budget: Budget, settlements: list[Settlement]) -> None:
        type(self).settle_calls += 1
        type(self).settled += len(settlements)
        super().settle(budget, settlements)


def _job(pg_sessions, settings, tmp_path: Path, provider: str, lines: int,
         batch_size: int) -> tuple[str, list[BatchRef]]:
    (tmp_path / "d.toml").write_text(
        f'[deployments.fast]\nprovider = "openai"\nbase_url = "{provider}/v1"\nmodel = "m"\n'
        'rpm = 1000000\ntpm = 100000000\nmax_concurrency = 8\n[routes]\n"*" = "fast"\n')
    settings.deployments_file = tmp_path / "d.toml"
    settings.batch_size = batch_size
    collect = _Collect()
    job = pipeline.create_job_in_process(
        pg_sessions, io.BytesIO(jsonl([chat_line(f"r{i}") for i in range(lines)])),
        settings=settings, deployments=settings.load_deployments(), dispatcher=collect,
        queue="realtime")
    return job.id, collect.batches


def _statements_per_batch(pg_sessions, settings, redis_url: str, batch: BatchRef) -> int:
    executor = BatchExecutor(pg_sessions, settings.load_deployments(), RedisLimiter(redis_url),
                             settings, breaker=RedisCircuitBreaker(redis_url))
    seen: list[str] = []

    def count(_conn, _cursor, statement: str, *_args: object) -> None:
        seen.append(statement)

    engine = get_engine(settings.database_url)
    event.listen(engine, "before_cursor_execute", count)
    try:
        report = executor.run(batch)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    assert report.succeeded == batch.last_line - batch.first_line + 1
    return len(seen)


def test_statements_per_batch_do_not_grow_with_its_size(pg_sessions, settings, redis_url,
                                                        tmp_path, counting_provider) -> None:
    # Given batches of 10 and of 200 requests against an instant provider
    _, small = _job(pg_sessions, settings, tmp_path, counting_provider, 10, 10)
    _, large = _job(pg_sessions, settings, tmp_path, counting_provider, 200, 200)
    # When each runs
    few = _statements_per_batch(pg_sessions, settings, redis_url, small[0])
    many = _statements_per_batch(pg_sessions, settings, redis_url, large[0])
    # Then the large one issues a few more SQL statements than the small one (results are
    # written a chunk at a time, once 64 wait or every 0.1 s), not one or more per request
    assert few <= 10, few
    assert many < 200 / 4, (few, many)


def test_settlements_go_to_redis_a_chunk_at_a_time(pg_sessions, settings, redis_url,
                                                   tmp_path, counting_provider) -> None:
    # Given a batch of 200 requests
    _, batches = _job(pg_sessions, settings, tmp_path, counting_provider, 200, 200)
    _CountingLimiter.settle_calls = _CountingLimiter.settled = 0
    executor = BatchExecutor(pg_sessions, settings.load_deployments(),
                             _CountingLimiter(redis_url), settings,
                             breaker=RedisCircuitBreaker(redis_url))
    # When it runs
    assert executor.run(batches[0]).succeeded == 200
    # Then every call was settled, in far fewer round trips than calls
    assert _CountingLimiter.settled == 200
    assert _CountingLimiter.settle_calls < 200 / 4, _CountingLimiter.settle_calls


def test_connections_outlive_the_batch_that_opened_them(pg_sessions, settings, redis_url,
                                                        tmp_path, counting_provider) -> None:
    # Given five batches of 20 for a deployment that allows 8 calls at once
    _, batches = _job(pg_sessions, settings, tmp_path, counting_provider, 100, 20)
    executor = BatchExecutor(pg_sessions, settings.load_deployments(), RedisLimiter(redis_url),
                             settings, breaker=RedisCircuitBreaker(redis_url))
    # When one worker thread runs them one after another
    for batch in batches:
        assert executor.run(batch).succeeded == 20
    # Then they shared the first batch's connections: at most 8 were ever opened
    assert 1 <= _KeepAliveServer.connections <= 8, _KeepAliveServer.connections

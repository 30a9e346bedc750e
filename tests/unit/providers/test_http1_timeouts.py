"""The lean HTTP/1.1 client's timeouts (quotaflow/providers/http1.py): each call fails at
its own deadline, not before and not much after, while the calls share one timer
(set for the earliest deadline in flight)."""

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from quotaflow.providers.http1 import Http1Pool
from tests.harness.http_requests import requests_of

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"


async def _serve(hang: Callable[[bytes], bool],
                 run: Callable[[Http1Pool], Awaitable[None]], timeout_s: float) -> None:
    """A server on 127.0.0.1 that answers each request at once, or never where
    `hang(body)`; `run(pool)` against it."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async for _, body in requests_of(reader):
                if hang(body):
                    await asyncio.sleep(3600)
                writer.write(ANSWER)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pool = Http1Pool(f"http://127.0.0.1:{port}/v1", {}, timeout_s=timeout_s,
                     connect_timeout_s=timeout_s)
    try:
        await run(pool)
    finally:
        pool.close()
        server.close()


async def _timed(call: Awaitable[object]) -> tuple[float, BaseException | None]:
    started = time.monotonic()
    try:
        await call
    except (TimeoutError, OSError) as exc:
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


# A timeout that never fires leaves a call hanging: fail in seconds, not at the suite's limit.
@pytest.mark.timeout(15)
def test_each_hung_call_times_out_at_its_own_deadline() -> None:
    """Three hung calls started 0.1 s apart, answered calls between them: each fails
    with TimeoutError 0.3 s after its own start; the answered ones are unaffected."""
    outcomes: list[tuple[str, float, BaseException | None]] = []

    async def run(pool: Http1Pool) -> None:
        async def call(name: str, delay: float) -> None:
            await asyncio.sleep(delay)
            took, error = await _timed(pool.post("chat", name.encode()))
            outcomes.append((name, took, error))

        await asyncio.gather(*(call(f"hang{n}", 0.1 * n) for n in range(3)),
                             *(call(f"ok{n}", 0.05 * n) for n in range(8)))

    asyncio.run(_serve(lambda body: body.startswith(b"hang"), run, timeout_s=0.3))
    hung = sorted((o for o in outcomes if o[0].startswith("hang")), key=lambda o: o[0])
    assert [type(error) for _, _, error in hung] == [TimeoutError] * 3
    for name, took, _ in hung:
        assert 0.29 <= took < 0.45, (name, took)
    answered = [o for o in outcomes if o[0].startswith("ok")]
    assert len(answered) == 8 and all(error is None for _, _, error in answered)


@pytest.mark.timeout(15)
def test_a_call_answered_in_time_is_not_failed_by_an_earlier_deadline() -> None:
    """A call that hangs sets the shared timer; one answered meanwhile is not failed
    when that timer fires, and a later hung call still times out on time."""
    results: dict[str, tuple[float, BaseException | None]] = {}

    async def run(pool: Http1Pool) -> None:
        async def call(name: str, delay: float) -> None:
            await asyncio.sleep(delay)
            results[name] = await _timed(pool.post("chat", name.encode()))

        await asyncio.gather(call("hang-first", 0.0), call("ok", 0.1),
                             call("hang-late", 0.25))

    asyncio.run(_serve(lambda body: body.startswith(b"hang"), run, timeout_s=0.3))
    assert results["ok"][1] is None
    assert isinstance(results["hang-first"][1], TimeoutError)
    assert isinstance(results["hang-late"][1], TimeoutError)
    assert 0.29 <= results["hang-late"][0] < 0.45



@pytest.mark.timeout(15)
def test_a_providers_edge_raises_its_calls_failures_as_retryable_errors() -> None:
    """Through ProviderEdge: a hung call, a refused connection and an answer that is not
    HTTP each come out as RetryableProviderError naming the deployment, the original as
    its cause (what the retry policy retries); an answered call is untouched."""
    from quotaflow.deployments.deployment import Deployment
    from quotaflow.errors import RetryableProviderError
    from quotaflow.providers.edge import ProviderEdge

    def edge(port: int) -> ProviderEdge:
        deployment = Deployment(name="d1", provider="openai", model="m", timeout_s=0.3, rpm=60,
                                tpm=6000,
                                base_url=f"http://127.0.0.1:{port}/v1")
        return ProviderEdge(deployment, f"http://127.0.0.1:{port}/v1/", {}, lambda k: k)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async for _, body in requests_of(reader):
                if body == b"hang":
                    await asyncio.sleep(3600)
                writer.write(b"SMTP ready\r\n\r\n" if body == b"garbage" else ANSWER)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def run() -> dict[str, BaseException | int]:
        server = await asyncio.start_server(answer, "127.0.0.1", 0)
        closed = await asyncio.start_server(answer, "127.0.0.1", 0)
        refused_port = closed.sockets[0].getsockname()[1]
        closed.close()
        await closed.wait_closed()
        live = edge(server.sockets[0].getsockname()[1])
        outcomes: dict[str, BaseException | int] = {}
        for name, target in (("ok", live), ("hang", live), ("garbage", live),
                             ("refused", edge(refused_port))):
            try:
                outcomes[name] = (await target.post("chat", name.encode())).status
            except RetryableProviderError as exc:
                outcomes[name] = exc
        server.close()
        return outcomes

    outcomes = asyncio.run(run())
    assert outcomes["ok"] == 200
    hang, garbage, refused = outcomes["hang"], outcomes["garbage"], outcomes["refused"]
    assert isinstance(hang, RetryableProviderError) and "d1: request timed out" in str(hang)
    assert isinstance(hang.__cause__, TimeoutError)
    assert isinstance(garbage, RetryableProviderError)
    assert "d1: connection failed (Http1Error)" in str(garbage)
    assert isinstance(refused, RetryableProviderError)
    assert "d1: connection failed (ConnectionRefusedError)" in str(refused)

"""The lean HTTP/1.1 client (quotaflow/providers/http1.py) over TLS, as it talks to real
providers: a server in this process with a certificate from a throwaway authority."""

import asyncio
import ssl
from collections.abc import Awaitable, Callable

import pytest
import trustme

from quotaflow.providers import http1
from quotaflow.providers.http1 import Http1Pool
from tests.harness.http_requests import requests_of

ANSWER = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
          b"\r\n7\r\n{\"ok\": \r\n5\r\ntrue}\r\n0\r\n\r\n")


async def _serve(ca: trustme.CA, run: Callable[[int, list[bytes]], Awaitable[None]]) -> list[int]:
    """Run `run(port, requests)` against a TLS server on 127.0.0.1; the connections' count."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(context)
    requests: list[bytes] = []
    connections: list[int] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            async for head, body in requests_of(reader):
                requests.append(head + body)
                writer.write(ANSWER)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    try:
        await run(port, requests)
    finally:
        server.close()
    return connections


def test_answers_come_back_over_tls_on_one_kept_connection() -> None:
    ca = trustme.CA()
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)

    async def calls(port: int, requests: list[bytes]) -> None:
        pool = Http1Pool(f"https://localhost:{port}/v1", {"Authorization": "Bearer k"},
                         timeout_s=10, connect_timeout_s=5, ssl_context=client_context)
        try:
            for n in range(3):
                response = await pool.post("chat/completions", b'{"n": %d}' % n)
                assert (response.status, response.body) == (200, b'{"ok": true}')
        finally:
            pool.close()
        assert requests[0].startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
        assert b"Host: localhost:" in requests[0] and b"Authorization: Bearer k" in requests[0]
        assert [r.rsplit(b"\r\n\r\n", 1)[1] for r in requests] == [
            b'{"n": 0}', b'{"n": 1}', b'{"n": 2}']

    assert len(asyncio.run(_serve(ca, calls))) == 1


def test_a_certificate_from_an_unknown_authority_is_refused() -> None:
    ca = trustme.CA()

    async def call(port: int, requests: list[bytes]) -> None:
        pool = Http1Pool(f"https://localhost:{port}/v1", {}, timeout_s=10,
                         connect_timeout_s=5)  # the system's authorities only
        try:
            with pytest.raises(ssl.SSLCertVerificationError):
                await pool.post("chat/completions", b"{}")
        finally:
            pool.close()
        assert requests == []

    asyncio.run(_serve(ca, call))


def test_a_connection_idle_past_the_expiry_is_closed_not_reused(monkeypatch) -> None:
    # A server closes idle keep-alive connections on its own timer: a request written as
    # it fires fails unanswered. Past the pool's expiry a new connection is made instead.
    monkeypatch.setattr(http1, "IDLE_EXPIRY_S", 0.2)
    ca = trustme.CA()
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)

    async def calls(port: int, requests: list[bytes]) -> None:
        pool = Http1Pool(f"https://localhost:{port}/v1", {}, timeout_s=10,
                         connect_timeout_s=5, ssl_context=client_context)
        try:
            for pause in (0.0, 0.05, 0.3, 0.0):  # the third call comes after the expiry
                await asyncio.sleep(pause)
                assert (await pool.post("chat/completions", b"{}")).status == 200
        finally:
            pool.close()

    assert len(asyncio.run(_serve(ca, calls))) == 2

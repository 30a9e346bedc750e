"""Requests read off one connection by the small HTTP/1.1 servers the client tests run."""

import asyncio
from collections.abc import AsyncIterator


async def requests_of(reader: asyncio.StreamReader) -> AsyncIterator[tuple[bytes, bytes]]:
    """Each request on the connection as (head, body), until the client closes it
    (asyncio.IncompleteReadError)."""
    while head := await reader.readuntil(b"\r\n\r\n"):
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        yield head, await reader.readexactly(length)

"""A userspace TCP proxy that plays the network between namespaces: delay, loss, partitions.

This kernel has no netem qdisc, so a host's connections to another host's servers go
through one of these, run inside the client host's namespace: it listens on 127.0.0.1
there and connects across the veth and the bridge to the server's address, so what it
forwards still crosses a real link (which `tests/harness/netns.py` can take down).

- delay: every chunk is held `delay_ms` in each direction, in order (a round trip costs
  twice that, plus the proxy's own time);
- loss: as TCP shows it to an application. A segment lost with probability `loss`
  reaches the other side a retransmission timeout later (200 ms, doubling if the
  retransmission is lost too) and holds back what follows it; a lost SYN costs 1 s;
- block: a partition. A blocked route forwards nothing and opens no connection until it
  is unblocked; nothing is dropped or reset, so once healed what waited on an open
  connection is delivered, as TCP's retransmissions deliver it after a partition
  shorter than their timeout (even after its client closed it: the kernel still sends
  what was written). Clients with timeouts of their own give up meanwhile, as they
  would; a connection opened during the partition and closed before it heals never
  reaches the server, as its SYN would not have.

Routes listed with --pass are not shaped: they let the test, in the machine's own
namespace, reach a host's server through a Unix socket.

    python -m tests.harness.netproxy --control /tmp/x/b.sock \\
        --route redis=127.0.0.1:6379=10.213.7.1:6379 --pass api=unix:/tmp/x/api=127.0.0.1:8000

Control: one JSON object per line on the control socket, e.g. {"delay_ms": 4,
"loss": 0.02, "block": ["redis", "postgres"]}; the answer is the state and the counters.
"""

import argparse
import asyncio
import contextlib
import json
import math
import random
from dataclasses import dataclass, field

MSS = 1448
RTO_S = 0.2
SYN_RTO_S = 1.0


@dataclass
class Shaping:
    """What every shaped route of this proxy suffers now."""

    delay_s: float = 0.0
    loss: float = 0.0
    blocked: set[str] = field(default_factory=set)
    healed: asyncio.Event = field(default_factory=asyncio.Event)
    counters: dict[str, int] = field(default_factory=lambda: {
        "connections": 0, "chunks": 0, "segments_lost": 0, "syns_lost": 0})

    def update(self, command: dict) -> None:
        if "delay_ms" in command:
            self.delay_s = float(command["delay_ms"]) / 1000
        if "loss" in command:
            self.loss = float(command["loss"])
        if "block" in command:
            self.blocked = set(command["block"])
            self.healed.set()  # every waiter looks again; those still blocked wait anew
            self.healed = asyncio.Event()

    async def passable(self, route: str) -> None:
        while route in self.blocked:
            await self.healed.wait()

    def penalty(self, size: int) -> float:
        """The retransmission delay of a chunk of `size` bytes whose segments may be lost."""
        extra = 0.0
        for _ in range(max(1, math.ceil(size / MSS)) if self.loss else 0):
            timeout = RTO_S
            while random.random() < self.loss:
                self.counters["segments_lost"] += 1
                extra += timeout
                timeout *= 2
        return extra

    def syn_penalty(self) -> float:
        extra, timeout = 0.0, SYN_RTO_S
        while self.loss and random.random() < self.loss:
            self.counters["syns_lost"] += 1
            extra += timeout
            timeout *= 2
        return extra


def parse_address(text: str) -> tuple[str, int] | str:
    """'unix:/path' -> '/path'; 'host:port' -> (host, port)."""
    if text.startswith("unix:"):
        return text.removeprefix("unix:")
    host, _, port = text.rpartition(":")
    return host, int(port)


async def connect(address: tuple[str, int] | str
                  ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    if isinstance(address, str):
        return await asyncio.open_unix_connection(address)
    return await asyncio.open_connection(*address)


async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, route: str,
               shaping: Shaping | None) -> None:
    """Copy one direction, each chunk held until its due time, in order."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def read_side() -> None:
        last_due = 0.0
        while True:
            try:
                data = await reader.read(65536)
            except OSError:
                data = b""
            due = loop.time()
            if shaping is not None and data:
                shaping.counters["chunks"] += 1
                due += shaping.delay_s + shaping.penalty(len(data))
            last_due = max(due, last_due)
            await queue.put((last_due, data))
            if not data:
                return

    async def write_side() -> None:
        while True:
            due, data = await queue.get()
            await asyncio.sleep(max(0.0, due - loop.time()))
            if shaping is not None:
                await shaping.passable(route)
            if not data:
                with contextlib.suppress(OSError):
                    if writer.can_write_eof():
                        writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    reading = asyncio.create_task(read_side())
    try:
        await write_side()
    finally:
        reading.cancel()


async def hold_while_blocked(route: str, client_r: asyncio.StreamReader,
                             shaping: Shaping) -> bytes | None:
    """A connection opened during a partition: what its client wrote meanwhile, to send
    once healed, or None if the client closed it first (as a SYN that never got through,
    nothing reaches the server)."""
    held = b""
    while route in shaping.blocked:
        healed = asyncio.ensure_future(shaping.healed.wait())
        reading = asyncio.ensure_future(client_r.read(65536))
        await asyncio.wait({healed, reading}, return_when=asyncio.FIRST_COMPLETED)
        healed.cancel()
        if not reading.done():
            reading.cancel()
            continue
        try:
            data = reading.result()
        except OSError:
            return None
        if not data:
            return None
        held += data
    return held


async def serve_route(name: str, listen: str, upstream: str, shaping: Shaping | None) -> None:
    target = parse_address(upstream)

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_w = None
        try:
            held = b""
            if shaping is not None:
                shaping.counters["connections"] += 1
                held = await hold_while_blocked(name, client_r, shaping)
                if held is None:
                    return  # the client gave up before the link came back: nothing went out
                await asyncio.sleep(2 * shaping.delay_s + shaping.syn_penalty())
            server_r, server_w = await connect(target)
            if held:
                server_w.write(held)
            await asyncio.gather(pump(client_r, server_w, name, shaping),
                                 pump(server_r, client_w, name, shaping))
        except OSError:
            pass
        finally:
            for writer in (client_w, server_w):
                if writer is not None:
                    writer.close()

    address = parse_address(listen)
    if isinstance(address, str):
        server = await asyncio.start_unix_server(handle, address)
    else:
        server = await asyncio.start_server(handle, *address, reuse_address=True)
    async with server:
        await server.serve_forever()


async def serve_control(path: str, shaping: Shaping) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            shaping.update(json.loads(line))
            state = {"delay_ms": shaping.delay_s * 1000, "loss": shaping.loss,
                     "block": sorted(shaping.blocked), **shaping.counters}
            writer.write(json.dumps(state).encode() + b"\n")
            await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(handle, path)
    async with server:
        await server.serve_forever()


async def main(args: argparse.Namespace) -> None:
    shaping = Shaping()
    tasks = [serve_control(args.control, shaping)]
    for spec, shaped in [(s, True) for s in args.route] + [(s, False) for s in args.passes]:
        name, listen, upstream = spec.split("=")
        tasks.append(serve_route(name, listen, upstream, shaping if shaped else None))
    await asyncio.gather(*tasks)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--control", required=True, help="Unix socket for commands")
    parser.add_argument("--route", action="append", default=[], help="NAME=LISTEN=UPSTREAM")
    parser.add_argument("--pass", dest="passes", action="append", default=[],
                        help="NAME=LISTEN=UPSTREAM, not shaped")
    asyncio.run(main(parser.parse_args()))

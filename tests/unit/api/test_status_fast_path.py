"""The status fast path (api/status_fast_path.py) with a stale object: the first read goes
to the route, which reads the job again; the reads that arrive while that read is in flight
wait for it in the fast path and are answered from it, not each sent through the route.
Plain ASGI calls on one event loop; the job's read is a callable held until released."""

import asyncio
import contextlib
import json
import threading
from typing import Any

from api.job_reads import JobReads
from api.status_fast_path import StatusFastPath
from quotaflow.tenants.grants import Grant, Scope

JOB = {"id": "batch_1", "status": "in_progress", "request_counts": {"completed": 1}}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def scope_for(path: str) -> dict[str, Any]:
    return {"type": "http", "method": "GET", "path": path, "query_string": b"",
            "headers": [(b"authorization", b"Bearer qf-key")]}


async def call(app: Any, path: str) -> tuple[int, bytes]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope_for(path), receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_reads_arriving_during_a_read_wait_for_it_instead_of_taking_the_route() -> None:
    clock, hold = Clock(), threading.Event()
    reads = JobReads(0.5, sessions=contextlib.nullcontext, clock=clock)  # type: ignore[arg-type]
    key, routed, made = ("job", "batch_1"), [], []

    def load(session: Any) -> tuple[str, dict[str, Any]]:
        made.append(len(made) + 1)
        if len(made) > 1:
            assert hold.wait(5)  # the second read stays in flight until released
        return "acme", JOB | {"request_counts": {"completed": len(made)}}

    async def route(scope: Any, receive: Any, send: Any) -> None:
        routed.append(scope["path"])
        seen = await reads.latest(key, load)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": seen.body})

    fast = StatusFastPath(route, reads=lambda: reads, remembered=lambda presented: Grant(
        "key_1", "acme", False, Scope.READ))

    async def scenario() -> list[tuple[int, bytes]]:
        # The first read: nothing kept, so the route reads it; the next is kept
        assert (await call(fast, "/jobs/batch_1"))[0] == 200 and routed == ["/jobs/batch_1"]
        assert (await call(fast, "/jobs/batch_1"))[0] == 200 and fast.answered == 1
        # Stale: a read of it starts (a route's, or a long-poll's) and is held mid-read
        clock.now += 1
        started = asyncio.ensure_future(reads.latest(key, load))
        await asyncio.sleep(0.05)
        # The twenty reads arriving meanwhile wait for it rather than taking the route
        crowd = [asyncio.ensure_future(call(fast, "/jobs/batch_1")) for _ in range(20)]
        await asyncio.sleep(0.05)
        hold.set()
        await started
        return await asyncio.gather(*crowd)

    answers = asyncio.run(scenario())
    assert routed == ["/jobs/batch_1"] and fast.answered == 21 and len(made) == 2
    assert {status for status, _ in answers} == {200}
    assert [json.loads(body)["request_counts"]["completed"] for _, body in answers] == [2] * 20

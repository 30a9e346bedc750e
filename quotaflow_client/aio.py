"""quotaflow.AsyncClient: the Client's calls as coroutines, for an asyncio program.

Each call runs the Client's own in a worker thread (asyncio.to_thread), so both clients
share one behaviour (retries, errors, the in-process engine, the joins) and the event
loop never blocks on an upload, a long wait or a table being read.
"""

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from quotaflow.config import Settings
from quotaflow_client.client import Client, Job

# Output rows handed from the thread to the loop at a time.
ROWS_PER_HOP = 1000


async def _aiter(rows: Iterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
    def chunk() -> list[dict[str, Any]]:
        return [row for _, row in zip(range(ROWS_PER_HOP), rows, strict=False)]

    while batch := await asyncio.to_thread(chunk):
        for row in batch:
            yield row


class AsyncJob:
    """A Job whose calls are awaited; `sync` is the Job itself."""

    def __init__(self, job: Job) -> None:
        self.sync = job

    def __repr__(self) -> str:
        return f"Async{self.sync!r}"

    @property
    def id(self) -> str:
        return self.sync.id

    @property
    def status(self) -> str:
        return self.sync.status

    @property
    def data(self) -> dict[str, Any]:
        return self.sync.data

    async def refresh(self) -> "AsyncJob":
        await asyncio.to_thread(self.sync.refresh)
        return self

    async def wait(self, progress: bool = False) -> "AsyncJob":
        await asyncio.to_thread(self.sync.wait, progress)
        return self

    async def cancel(self) -> "AsyncJob":
        await asyncio.to_thread(self.sync.cancel)
        return self

    async def retry(self) -> int:
        return await asyncio.to_thread(self.sync.retry)

    def results(self) -> AsyncIterator[dict[str, Any]]:
        return _aiter(self.sync.results())

    def lines(self, errors: bool = False) -> AsyncIterator[dict[str, Any]]:
        return _aiter(self.sync.lines(errors))

    async def to_table(self, path: str | Path | None = None) -> Any:
        return await asyncio.to_thread(self.sync.to_table, path)


class AsyncJobs:
    def __init__(self, client: Client) -> None:
        self._client = client

    async def list(self, limit: int = 20) -> list[AsyncJob]:
        return [AsyncJob(job) for job in await asyncio.to_thread(self._client.jobs.list, limit)]

    async def get(self, job_id: str) -> AsyncJob:
        return AsyncJob(await asyncio.to_thread(self._client.jobs.get, job_id))


class AsyncClient:
    """`AsyncClient()` over HTTP, `AsyncClient.embedded()` in this process; the same
    arguments as Client's."""

    def __init__(self, base_url: str | None = None, api_key: str | None = None, *,
                 settings: Settings | None = None, timeout: float = 60.0,
                 client: Client | None = None) -> None:
        self.sync = client or Client(base_url, api_key, settings=settings, timeout=timeout)
        self.jobs = AsyncJobs(self.sync)

    @classmethod
    def embedded(cls, settings: Settings | None = None, concurrency: int = 4,
                 quiet: bool = False) -> "AsyncClient":
        return cls(client=Client.embedded(settings, concurrency, quiet))

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await asyncio.to_thread(self.sync.close)

    async def submit(self, data: Any = None, **options: Any) -> AsyncJob:
        """Client.submit's arguments (`after` may be an AsyncJob); the job, not yet waited
        for."""
        if isinstance(options.get("after"), AsyncJob):
            options["after"] = options["after"].sync
        return AsyncJob(await asyncio.to_thread(lambda: self.sync.submit(data, **options)))

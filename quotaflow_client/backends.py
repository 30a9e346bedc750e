"""Where a Client's jobs live: a running API over HTTP, or this process.

Both answer in the API's job objects and output lines, and raise quotaflow's errors
(quotaflow/errors.py), so Client and Job are written once over either.
"""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from quotaflow_client.http import ApiClient
from quotaflow_client.progress import request_progress

if TYPE_CHECKING:  # the engine is loaded only by Client.embedded()
    from quotaflow_client.embedded import Embedded


class Backend(Protocol):
    def create(self, path: Path, *, queue: str, metadata: dict[str, str] | None,
               max_attempts: int | None, dedup: bool | None,
               filename: str) -> dict[str, Any]: ...

    def job(self, job_id: str) -> dict[str, Any]: ...

    def list_jobs(self, limit: int) -> list[dict[str, Any]]: ...

    def cancel(self, job_id: str) -> dict[str, Any]: ...

    def retry(self, job_id: str) -> dict[str, Any]: ...

    def lines(self, job_id: str, errors: bool) -> Iterator[dict[str, Any]]: ...

    def wait(self, job_id: str, progress: bool) -> dict[str, Any]: ...

    def close(self) -> None: ...


class HttpBackend:
    """The REST API, through the CLI's own client (retries, Idempotency-Key, errors)."""

    def __init__(self, api: ApiClient) -> None:
        self.api = api

    def create(self, path: Path, *, queue: str, metadata: dict[str, str] | None,
               max_attempts: int | None, dedup: bool | None, filename: str) -> dict[str, Any]:
        return self.api.create_job(path, queue, json.dumps(metadata) if metadata else None,
                                   max_attempts, dedup=dedup, filename=filename)

    def job(self, job_id: str) -> dict[str, Any]:
        return self.api.get_job(job_id)

    def list_jobs(self, limit: int) -> list[dict[str, Any]]:
        return self.api.list_jobs(limit)

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self.api.cancel_job(job_id)

    def retry(self, job_id: str) -> dict[str, Any]:
        return self.api.retry_job(job_id)

    def lines(self, job_id: str, errors: bool) -> Iterator[dict[str, Any]]:
        return self.api.output_lines(job_id, errors)

    def wait(self, job_id: str, progress: bool) -> dict[str, Any]:
        """Follows the job's event stream to its end, as `quotaflow status --watch`."""
        job = self.api.get_job(job_id)
        with request_progress(not progress) as shown:
            task = shown.add_task(job_id, total=job["request_counts"]["total"])
            for seen in self.api.watch_job(job_id):
                job = seen
                counts = job["request_counts"]
                shown.update(task, completed=counts["completed"] + counts["failed"],
                             description=f"{job_id} {job['status']}")
        return job

    def close(self) -> None:
        self.api.close()


class EmbeddedBackend:
    """This process, on the embedded defaults: a job's batches run in wait()."""

    def __init__(self, engine: "Embedded", concurrency: int) -> None:
        self.engine, self.concurrency = engine, concurrency

    def create(self, path: Path, *, queue: str, metadata: dict[str, str] | None,
               max_attempts: int | None, dedup: bool | None, filename: str) -> dict[str, Any]:
        return self.engine.create(path, queue, dedup=dedup, filename=filename,
                                  metadata=metadata, max_attempts=max_attempts)

    def job(self, job_id: str) -> dict[str, Any]:
        return self.engine.job(job_id)

    def list_jobs(self, limit: int) -> list[dict[str, Any]]:
        return self.engine.list_jobs(limit)

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self.engine.cancel(job_id)

    def retry(self, job_id: str) -> dict[str, Any]:
        return self.engine.retry(job_id)

    def lines(self, job_id: str, errors: bool) -> Iterator[dict[str, Any]]:
        return map(orjson.loads, self.engine.lines(job_id, errors))

    def wait(self, job_id: str, progress: bool) -> dict[str, Any]:
        self.engine.run_pending(self.concurrency, quiet=not progress, label=job_id)
        return self.engine.job(job_id)

    def close(self) -> None:
        """Nothing to let go: the database engine is the process's, shared per URL."""

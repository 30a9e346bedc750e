"""quotaflow on the embedded defaults, in this process: `quotaflow run` and
`quotaflow.Client.embedded()`.

No broker and no server: jobs live in the configured database (a SQLite file unless
QUOTAFLOW_DATABASE_URL says otherwise) and their batches run here, concurrently, through
the same execution code the Celery workers use. A job's batches are collected when it is
made (or retried) and run by `run_pending`, with the progress of the CLI's commands.
"""

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import select

from quotaflow.config import Settings
from quotaflow.constants import MOCK_PROVIDER
from quotaflow.db import upgrade
from quotaflow.deployments.catalog import Deployments
from quotaflow.dispatch.queues import BatchRef, CollectingDispatcher
from quotaflow.execution import BatchExecutor
from quotaflow.ingest import pipeline
from quotaflow.jobs import service as jobs
from quotaflow.jobs import view as job_view
from quotaflow.models import Item
from quotaflow.providers.local import close_engines, runner_for, shutting_down
from quotaflow.results.output import iter_output
from quotaflow.runtime import Runtime
from quotaflow_client.progress import request_progress, stderr

# The job's output lines: errors=False its results, errors=True its error lines.
OutputLines = Callable[[bool], Iterator[str]]


def uses_only_mock(deployments: Deployments) -> bool:
    return all(d.provider == MOCK_PROVIDER for d in deployments.deployments.values())


class Embedded:
    """The engine of one process: jobs made, run, read, cancelled and retried here."""

    def __init__(self, settings: Settings, quiet: bool = False) -> None:
        self.settings = settings
        self.runtime = Runtime(settings, in_process=True, metrics=False)  # nothing serves them
        if uses_only_mock(self.runtime.deployments) and not quiet:
            stderr.print("[yellow]Using the built-in mock provider: every response is "
                         "SIMULATED. Set QUOTAFLOW_DEPLOYMENTS_FILE to call a real "
                         "model.[/yellow]", soft_wrap=True)
        upgrade(settings.database_url)
        self.sessions = self.runtime.sessions
        dispatcher = self.runtime.dispatcher
        assert isinstance(dispatcher, CollectingDispatcher)
        self.dispatcher = dispatcher

    def create(self, path: Path, queue: str, *, dedup: bool | None = None,
               filename: str | None = None, metadata: dict[str, str] | None = None,
               max_attempts: int | None = None,
               caps: tuple[int | None, int | None] = (None, None)) -> dict[str, Any]:
        """Store the JSONL file as a job (or refuse it, storing nothing); its batches wait
        for run_pending. The job object. `caps`: its max RPM and TPM."""
        with path.open("rb") as handle:
            job = pipeline.create_job_in_process(
                self.sessions, handle, settings=self.settings,
                deployments=self.runtime.deployments, dispatcher=self.dispatcher, queue=queue,
                filename=filename or path.name, metadata=metadata, max_attempts=max_attempts,
                dedup=dedup, max_rpm=caps[0], max_tpm=caps[1])
        return self.job(job.id)

    def job(self, job_id: str) -> dict[str, Any]:
        with self.sessions() as session:
            return job_view.job_object(session, jobs.get_job(session, job_id))

    def list_jobs(self, limit: int) -> list[dict[str, Any]]:
        with self.sessions() as session:
            return [job_view.job_object(session, job)
                    for job in jobs.list_jobs(session, limit=limit)]

    def cancel(self, job_id: str) -> dict[str, Any]:
        jobs.cancel_job(self.sessions, job_id)
        return self.job(job_id)

    def retry(self, job_id: str) -> dict[str, Any]:
        retried = jobs.retry_failed(self.sessions, job_id, self.dispatcher, self.settings)
        return self.job(job_id) | {"retried": retried}

    def lines(self, job_id: str, errors: bool) -> Iterator[str]:
        """Result (or error) lines in input order, on a session of their own, so two may
        be read side by side (a table out joins both to the input's rows)."""
        with self.sessions() as session:
            yield from iter_output(session, job_id, errors=errors)

    def run_pending(self, concurrency: int = 4, quiet: bool = False,
                    label: str = "batches") -> None:
        """Run every batch waiting in this process, with the progress of the CLI."""
        batches, self.dispatcher.batches = self.dispatcher.batches, []
        if not batches:
            return
        job_ids = {ref.job_id for ref in batches}
        total = sum(self.job(job_id)["request_counts"]["pending"] for job_id in job_ids)
        with self.sessions() as session:
            routes = session.scalars(select(Item.route).where(Item.job_id.in_(job_ids))
                                     .distinct())
            local = {d.name: d for d in map(self.runtime.deployments.local_deployment_for,
                                            routes) if d}
        try:
            for deployment in local.values():  # loaded and warmed before the progress starts
                if not quiet:
                    stderr.print(f"loading and warming up local model {deployment.name!r}...")
                runner_for(deployment)
            with request_progress(quiet) as progress:
                task = progress.add_task(label, total=total)
                asyncio.run(_run_batches(self.runtime.executor, batches, concurrency,
                                         lambda _ok: progress.advance(task)))
        except asyncio.CancelledError:  # Ctrl-C (_on_ctrl_c): it ends as interrupted
            raise KeyboardInterrupt from None
        finally:  # done or interrupted: a local model's engine ends now, not at exit
            _close_engines()


def run_file(settings: Settings, input_path: Path, deliver: Callable[[OutputLines], None],
             queue: str, concurrency: int, dedup: bool | None = None,
             quiet: bool = False, filename: str | None = None,
             engine: "Embedded | None" = None,
             metadata: dict[str, str] | None = None,
             caps: tuple[int | None, int | None] = (None, None)) -> dict[str, Any]:
    """`quotaflow run`: process the file, hand its output to `deliver` (a function of
    `errors` giving the job's result or error lines); returns the final job object.
    `engine` is one already made (a stage read its previous job's results from it)."""
    engine = engine or Embedded(settings, quiet)
    job = engine.create(input_path, queue, dedup=dedup, filename=filename,
                        metadata=metadata, caps=caps)
    engine.run_pending(concurrency, quiet, label=job["id"])
    deliver(lambda errors: engine.lines(job["id"], errors))
    return engine.job(job["id"])


def _close_engines() -> None:
    """close_engines(), which a second Ctrl-C must not cut short: an engine half shut
    down leaves the interpreter's exit waiting on vLLM's processes. Its waits are bounded
    (seconds), and the command ends as interrupted either way."""
    if threading.current_thread() is not threading.main_thread():
        close_engines()
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        close_engines()
    finally:
        signal.signal(signal.SIGINT, previous)


async def _run_batches(executor: BatchExecutor, batches: list[BatchRef], concurrency: int,
                       on_item: Callable[[bool], None]) -> None:
    semaphore = asyncio.Semaphore(concurrency)

    async def one(ref: BatchRef) -> None:
        async with semaphore:
            while (report := await executor.run_async(ref, on_item)).retry_in is not None:
                await asyncio.sleep(report.retry_in)

    loop = asyncio.get_running_loop()
    closing = _on_ctrl_c(loop, asyncio.current_task())
    try:
        await asyncio.gather(*(one(ref) for ref in batches))
    finally:
        if closing:  # the local engines end first: what they held is handed back
            await closing[0]
        await executor.aclose()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.remove_signal_handler(signal.SIGINT)


def _on_ctrl_c(loop: asyncio.AbstractEventLoop,
               main: "asyncio.Task[None] | None") -> "list[asyncio.Future[None]]":
    """Ctrl-C: the local engines are shut down at once (a request one held is handed
    back, its line left to run again) while the batches end, so the command does not
    wait for generations under way. Run on the loop, not in the signal handler, so it
    may start a thread. A second Ctrl-C stops waiting. The list gets the engines' close."""
    closing: list[asyncio.Future[None]] = []

    def interrupted() -> None:
        if closing:
            raise KeyboardInterrupt
        shutting_down()
        closing.append(loop.run_in_executor(None, close_engines))
        if main is not None:
            main.cancel()

    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not main thread
        loop.add_signal_handler(signal.SIGINT, interrupted)
    return closing

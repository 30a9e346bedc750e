"""`quotaflow run`: one file, processed in this process, on the embedded defaults.

No broker and no server: the job lives in the configured database (a SQLite
file unless QUOTAFLOW_DATABASE_URL says otherwise) and its batches run here,
concurrently, through the same execution code the Celery workers use.
"""

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from sqlalchemy import select

from cli.progress import request_progress, stderr
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

# The job's output lines: errors=False its results, errors=True its error lines.
OutputLines = Callable[[bool], Iterator[str]]


def uses_only_mock(deployments: Deployments) -> bool:
    return all(d.provider == MOCK_PROVIDER for d in deployments.deployments.values())


def run_file(settings: Settings, input_path: Path, deliver: Callable[[OutputLines], None],
             queue: str, concurrency: int, dedup: bool | None = None,
             quiet: bool = False, filename: str | None = None) -> dict:
    """Process the file, hand its output to `deliver`; returns the final job object.

    `deliver` gets a function of `errors` giving the job's result (or error) lines in
    input order, each call on a session of its own, so that two may be read side by
    side (a table out joins both to the input's rows)."""
    runtime = Runtime(settings, in_process=True, metrics=False)  # nothing serves them
    if uses_only_mock(runtime.deployments) and not quiet:
        stderr.print("[yellow]Using the built-in mock provider: every response is SIMULATED. "
                     "Set QUOTAFLOW_DEPLOYMENTS_FILE to call a real model.[/yellow]",
                     soft_wrap=True)
    upgrade(settings.database_url)
    sessions, dispatcher = runtime.sessions, runtime.dispatcher
    assert isinstance(dispatcher, CollectingDispatcher)
    with input_path.open("rb") as handle:
        job = pipeline.create_job_in_process(
            sessions, handle, settings=settings, deployments=runtime.deployments,
            dispatcher=dispatcher, queue=queue, filename=filename or input_path.name,
            dedup=dedup)
    executor = runtime.executor
    with sessions() as session:
        pending = job_view.job_object(session, jobs.get_job(session, job.id))["request_counts"]
        routes = session.scalars(select(Item.route).where(Item.job_id == job.id).distinct())
        local = {d.name: d for d in map(runtime.deployments.local_deployment_for, routes) if d}
    try:
        for deployment in local.values():  # loaded and warmed before the progress starts
            if not quiet:
                stderr.print(f"loading and warming up local model {deployment.name!r}...")
            runner_for(deployment)
        with request_progress(quiet) as progress:
            task = progress.add_task(job.id, total=pending["pending"])
            asyncio.run(_run_batches(executor, dispatcher.batches, concurrency,
                                     lambda _ok: progress.advance(task)))
    except asyncio.CancelledError:  # Ctrl-C (_on_ctrl_c): the command ends as interrupted
        raise KeyboardInterrupt from None
    finally:  # done or interrupted: a local model's engine ends now, not at exit
        _close_engines()

    def lines(errors: bool) -> Iterator[str]:
        with sessions() as session:
            yield from iter_output(session, job.id, errors=errors)

    deliver(lines)
    with sessions() as session:
        return job_view.job_object(session, jobs.get_job(session, job.id))


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

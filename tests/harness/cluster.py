"""What the multi-process tests share: a mock provider, a deployments file naming it,
Celery workers, and reading a job's progress from the database (through restarts)."""

import io
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from sqlalchemy import func, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.config import Settings
from quotaflow.ingest import pipeline
from quotaflow.jobs import service as jobs
from quotaflow.jobs import view as job_view
from quotaflow.models import Result
from quotaflow.results import output
from tests.harness.factories import jsonl
from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import service_env
from workers.dispatch import CeleryDispatcher

T = TypeVar("T")


def start_provider(tmp_path: Path, *options: str) -> tuple[Proc, str]:
    """A strict mock provider on a free port; its base URL."""
    port = free_port()
    proc = Proc("provider", quotaflow("mock-provider", "--port", str(port), *options),
                service_env(), tmp_path)
    url = f"http://127.0.0.1:{port}"
    proc.wait_http(f"{url}/healthz")
    return proc, url


def deployment_file(tmp_path: Path, name: str, provider_url: str, extra: str = "",
                    rpm: int = 600000, burst_seconds: float | None = None) -> Path:
    """A deployments file with one OpenAI-compatible deployment serving every model; its
    rpm and burst the provider's, where a test spends that budget to the last request."""
    burst = "" if burst_seconds is None else f"burst_seconds = {burst_seconds:g}\n"
    path = tmp_path / "deployments.toml"
    path.write_text(f'[deployments.{name}]\nprovider = "openai"\n'
                    f'base_url = "{provider_url}/v1"\nmodel = "{name}"\n'
                    f'rpm = {rpm}\n{burst}tpm = 100000000\n{extra}[routes]\n"*" = "{name}"\n')
    return path


def start_workers(env: dict[str, str], tmp_path: Path, prefix: str, count: int = 2,
                  concurrency: int = 2) -> list[Proc]:
    workers = [Proc(f"worker{n}", quotaflow("worker", "--concurrency", str(concurrency),
                                            "--name", f"{prefix}{n}@qftest"), env, tmp_path)
               for n in range(1, count + 1)]
    for worker in workers:
        worker.wait_until(lambda w=worker: " ready." in w.log())
    return workers


def _retrying(read: Callable[[], T]) -> T:
    for _ in range(50):  # the test's own connections see a database restart too
        try:
            return read()
        except OperationalError:
            time.sleep(0.2)
    raise TimeoutError("database did not come back")


def results_stored(sessions: sessionmaker[Session], job_id: str) -> int:
    def read() -> int:
        with sessions() as session:
            return session.scalar(select(func.count()).select_from(Result)
                                  .where(Result.job_id == job_id))
    return _retrying(read)


def job_status(sessions: sessionmaker[Session], job_id: str) -> str:
    def read() -> str:
        with sessions() as session:
            return jobs.get_job(session, job_id).status
    return _retrying(read)


def wait_until_finished(sessions: sessionmaker[Session], job_id: str, since: float,
                        timeout: float, total: int, restarted: Sequence[Proc] = ()) -> str:
    """Poll the job until it leaves in_progress; its status. The `restarted` processes
    are started again whenever one exits, as compose's restart policy would (Celery ends
    a worker on an error it calls unrecoverable); the failure message names them."""
    exits: list[str] = []
    while (status := job_status(sessions, job_id)) == "in_progress":
        assert time.monotonic() - since < timeout, (
            f"{results_stored(sessions, job_id)} of {total} done {timeout:.0f} s after the "
            f"fault" + (f" (restarted: {', '.join(exits)})" if exits else ""))
        for proc in restarted:
            if (code := proc.restart_if_exited()) is not None:
                exits.append(f"{proc.name} had exited with {code}, see {proc.log_path}")
        time.sleep(0.5)
    return status


def submit_and_finish(sessions: sessionmaker[Session], settings: Settings, lines: list[dict],
                      timeout: float, queue: str = "realtime") -> dict:
    """Queue a job of `lines` on Celery and wait for it to leave in_progress; its view."""
    job = pipeline.create_job_in_process(
        sessions, io.BytesIO(jsonl(lines)), settings=settings,
        deployments=settings.load_deployments(), dispatcher=CeleryDispatcher(settings.broker_url),
        queue=queue)
    deadline = time.monotonic() + timeout
    while True:
        with sessions() as session:
            view = job_view.job_object(session, jobs.get_job(session, job.id))
        if view["status"] != "in_progress":
            return view
        assert time.monotonic() < deadline, view["request_counts"]
        time.sleep(0.5)


def one_result_per_line(sessions: sessionmaker[Session], job_id: str) -> tuple[int, int]:
    """(results, distinct lines with a result): equal when no line holds two results."""
    with sessions() as session:
        return session.execute(select(func.count(), func.count(func.distinct(Result.line_no)))
                               .where(Result.job_id == job_id)).one()


def output_ids(sessions: sessionmaker[Session], job_id: str) -> list[str]:
    with sessions() as session:
        return [json.loads(line)["custom_id"]
                for line in output.iter_output(session, job_id, errors=False)]

"""Retention on the real PostgreSQL: expiry deletes exactly what expired, in bounded
transactions, safely from several sweepers at once; a delete is all or nothing (a failure
mid-way leaves the job whole, or marked and finished by the next sweep); another tenant's
job or file is not found; a running job must be cancelled first."""

import io
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import event, func, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.compat import files, retention
from quotaflow.config import Settings
from quotaflow.db import get_engine
from quotaflow.deployments.catalog import builtin_deployments
from quotaflow.dispatch.queues import BatchRef, CollectingDispatcher
from quotaflow.errors import (
    FileNotFound,
    JobNotFound,
    JobStateError,
    ResultsDeleted,
)
from quotaflow.ingest import pipeline as ingest
from quotaflow.jobs import service as jobs
from quotaflow.jobs import view as job_view
from quotaflow.models import File, FileChunk, Item, ItemStatus, Job, JobStatus, Result, utcnow
from quotaflow.results import output
from quotaflow.results.leases import claim
from tests.harness.factories import chat_line, jsonl


@pytest.fixture
def sessions(pg_sessions: sessionmaker[Session], pg_url: str) -> Iterator[sessionmaker[Session]]:
    """pg_sessions, with no uploads left by other tests (the sweep would count them)."""
    with get_engine(pg_url).begin() as conn:
        conn.execute(text("TRUNCATE files, file_chunks CASCADE"))
    yield pg_sessions


def make_job(sessions: sessionmaker[Session], settings: Settings, lines: int, tag: str,
             tenant: str = "t", expires_after_s: int | None = None) -> str:
    spec = ingest.JobSpec(queue="bulk", tenant=tenant, enforce_quota=False,
                          output_expires_after_s=expires_after_s)
    data = jsonl([chat_line(f"{tag}{i}", f"{tag} prompt {i}") for i in range(lines)])
    return ingest.create_job(sessions, io.BytesIO(data), settings=settings,
                             deployments=builtin_deployments(),
                             dispatcher=CollectingDispatcher(), spec=spec).job.id


def finish(sessions: sessionmaker[Session], job_id: str) -> None:
    """Every line answered (in SQL: what matters here is the rows, not the calls)."""
    with sessions.begin() as session:
        session.execute(text(
            "INSERT INTO results (job_id, line_no, custom_id, request_id, status_code, "
            "response, prompt_tokens, completion_tokens, created_at) SELECT job_id, line_no, "
            "custom_id, 'batch_req_' || line_no, 200, '{\"answer\": 1}'::jsonb, 3, 5, now() "
            "FROM items WHERE job_id = :job AND status = 'pending'"), {"job": job_id})
        session.execute(update(Item).where(Item.job_id == job_id,
                                           Item.status == ItemStatus.PENDING)
                        .values(status=ItemStatus.SUCCEEDED, lease_expires_at=None))
    jobs.finish_if_done(sessions, job_id)


def rows(sessions: sessionmaker[Session], job_id: str) -> tuple[int, int]:
    with sessions() as session:
        return tuple(session.scalar(select(func.count()).select_from(model)
                                    .where(model.job_id == job_id)) for model in (Result, Item))


def job(sessions: sessionmaker[Session], job_id: str) -> Job:
    with sessions() as session:
        return session.get_one(Job, job_id)


def upload(sessions: sessionmaker[Session], tenant: str = "t", chunks: int = 1,
           expires_after_s: int | None = None) -> str:
    data = b"x" * (files.CHUNK_BYTES * (chunks - 1) + 10)
    return files.store_file(sessions, io.BytesIO(data), tenant=tenant, filename="in.jsonl",
                            purpose="batch", max_bytes=len(data),
                            expires_after_s=expires_after_s).id


def chunks_of(sessions: sessionmaker[Session], file_id: str) -> tuple[int, int]:
    with sessions() as session:
        return (session.scalar(select(func.count()).select_from(File).where(File.id == file_id)),
                session.scalar(select(func.count()).select_from(FileChunk)
                               .where(FileChunk.file_id == file_id)))


def test_expiry_deletes_exactly_the_expired_data_and_nothing_else(sessions, settings) -> None:
    # Given jobs kept an hour (the submitter's choice), two hours (the default) and for
    # ever (no default), one still running, and uploads kept an hour and for ever
    settings.result_retention_s = 7200
    hour = make_job(sessions, settings, 10, "h", expires_after_s=3600)
    default = make_job(sessions, settings, 10, "d")
    settings.result_retention_s = 0
    forever = make_job(sessions, settings, 10, "f")
    running = make_job(sessions, settings, 10, "r", expires_after_s=3600)
    for done in (hour, default, forever):
        finish(sessions, done)
    brief, kept = upload(sessions, expires_after_s=3600), upload(sessions)
    start = utcnow()
    assert job(sessions, hour).output_expires_after_s == 3600
    assert job(sessions, default).output_expires_after_s == 7200
    assert job(sessions, forever).output_expires_after_s is None
    with sessions() as session:
        view = job_view.job_object(session, job(sessions, hour))
        assert view["output_expires_at"] == view["completed_at"] + 3600
        assert files.file_object(files.get_file(session, brief, "t"))["expires_at"] == (
            files.file_object(files.get_file(session, brief, "t"))["created_at"] + 3600)
    # When the sweep runs before anything is due, nothing goes
    assert retention.sweep(sessions, budget_s=30, now=start + timedelta(seconds=3500)) == (
        retention.Swept())
    # When it runs an hour and a bit later
    later = start + timedelta(seconds=3700)
    swept = retention.sweep(sessions, budget_s=30, now=later)
    # Then the hour's job and upload are gone, and only they
    assert swept == retention.Swept(expired_jobs=[hour], removed_files=1, purged_jobs=1)
    assert rows(sessions, hour) == (0, 0)
    assert rows(sessions, default) == rows(sessions, forever) == (10, 10)
    assert rows(sessions, running) == (0, 10)
    assert chunks_of(sessions, brief) == (0, 0) and chunks_of(sessions, kept) == (1, 1)
    # And the expired job is a tombstone that still says what it was
    gone = job(sessions, hour)
    assert gone.deleted_at == later and gone.purged_at is not None
    assert gone.status == JobStatus.COMPLETED
    with sessions() as session:
        view = job_view.job_object(session, gone)
    assert view["deleted"] and view["deleted_at"] == int(later.timestamp())
    assert view["request_counts"]["completed"] == 10 and view["request_counts"]["total"] == 10
    assert view["usage"] == {"input_tokens": 30, "output_tokens": 50, "total_tokens": 80}
    with pytest.raises(ResultsDeleted, match="were expired"):
        retention.require_results(gone)
    # And sweeping again finds nothing more to do
    assert retention.sweep(sessions, budget_s=30, now=later) == retention.Swept()
    # Two hours on the default's job goes too; the one kept for ever never does
    assert retention.sweep(sessions, budget_s=30,
                           now=start + timedelta(seconds=7300)).expired_jobs == [default]
    assert retention.sweep(sessions, budget_s=30, now=start + timedelta(days=3650)) == (
        retention.Swept())
    assert rows(sessions, forever) == (10, 10) and rows(sessions, running) == (0, 10)
    assert chunks_of(sessions, kept) == (1, 1)


def test_past_its_expiry_the_output_is_gone_before_the_sweep_comes(sessions, settings) -> None:
    done = make_job(sessions, settings, 3, "p", expires_after_s=3600)
    finish(sessions, done)
    with sessions.begin() as session:  # it ended two hours ago
        session.execute(update(Job).where(Job.id == done).values(
            completed_at=utcnow() - timedelta(hours=2)))
    brief = upload(sessions, expires_after_s=3600)
    with sessions.begin() as session:
        session.execute(update(File).where(File.id == brief).values(expires_at=utcnow()))
    with sessions() as session:
        with pytest.raises(ResultsDeleted):
            retention.require_results(job(sessions, done))
        with pytest.raises(FileNotFound):
            files.virtual_file(session, files.output_file_id(done, errors=False), "t")
        with pytest.raises(FileNotFound):
            files.get_file(session, brief, "t")
        assert brief not in [row.id for row in files.list_files(session, "t", limit=100)]


class Deletes:
    """The DELETE statements run, with the rows each removed."""

    def __init__(self, pg_url: str) -> None:
        self.rowcounts: list[int] = []
        self.engine = get_engine(pg_url)

    def __enter__(self) -> "Deletes":
        event.listen(self.engine, "after_cursor_execute", self._seen)
        return self

    def __exit__(self, *_exc: object) -> None:
        event.remove(self.engine, "after_cursor_execute", self._seen)

    def _seen(self, _conn, cursor, statement: str, *_args: object) -> None:
        if statement.lstrip().upper().startswith("DELETE FROM RESULTS") or (
                statement.lstrip().upper().startswith("DELETE FROM ITEMS")):
            self.rowcounts.append(cursor.rowcount)


def test_a_large_purge_goes_in_bounded_transactions_and_resumes(sessions, settings, pg_url,
                                                                 monkeypatch) -> None:
    # Given a finished job of 3,000 lines, and chunks of 400 rows
    monkeypatch.setattr(retention, "PURGE_ROWS", 400)
    big = make_job(sessions, settings, 3000, "b")
    finish(sessions, big)
    # When it is deleted but the request is cut off before any purge (no time left)
    monkeypatch.setattr(retention, "INLINE_PURGE_S", 0.0)
    tombstone = retention.delete_job(sessions, big, "t")
    # Then it is a tombstone at once, whose rows are still there
    assert tombstone.deleted_at is not None and tombstone.purged_at is None
    assert rows(sessions, big) == (3000, 3000)
    # And the sweep finishes it, never more than a chunk's rows in one statement
    with Deletes(pg_url) as deletes:
        swept = retention.sweep(sessions, budget_s=60)
    assert swept.purged_jobs == 1 and rows(sessions, big) == (0, 0)
    assert max(deletes.rowcounts) == 400 and sum(deletes.rowcounts) == 6000
    assert job(sessions, big).purged_at is not None


def test_sweepers_on_several_workers_share_the_work_and_skip_held_rows(sessions, settings,
                                                                       monkeypatch) -> None:
    monkeypatch.setattr(retention, "PURGE_ROWS", 100)
    monkeypatch.setattr(retention, "INLINE_PURGE_S", 0.0)
    marked = [make_job(sessions, settings, 600, f"m{n}-") for n in range(3)]
    for job_id in marked:
        finish(sessions, job_id)
        retention.delete_job(sessions, job_id, "t")
    # Given another transaction holding the first job's row (a sweeper busy with it)
    holder = sessions()
    holder.execute(select(Job.id).where(Job.id == marked[0]).with_for_update(key_share=True))
    try:
        # When three sweepers run at once
        results: list[retention.Swept] = []
        failures: list[BaseException] = []

        def run() -> None:
            try:
                results.append(retention.sweep(sessions, budget_s=30))
            except BaseException as exc:  # reported by the assertion below
                failures.append(exc)

        threads = [threading.Thread(target=run) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        # Then none waits for the held job or fails; the others are purged once each
        assert not failures and len(results) == 3
        assert sum(swept.purged_jobs for swept in results) == 2
        assert rows(sessions, marked[0]) == (600, 600)
        assert rows(sessions, marked[1]) == rows(sessions, marked[2]) == (0, 0)
    finally:
        holder.rollback()
        holder.close()
    # And once it is free, the next sweep finishes it
    assert retention.sweep(sessions, budget_s=30).purged_jobs == 1
    assert rows(sessions, marked[0]) == (0, 0)


def test_a_failure_while_marking_leaves_the_job_whole(sessions, settings, monkeypatch) -> None:
    done = make_job(sessions, settings, 50, "w")
    finish(sessions, done)
    original = retention._mark

    def mark_then_fail(*args: object) -> None:
        original(*args)
        raise RuntimeError("injected: the connection broke before the commit")

    monkeypatch.setattr(retention, "_mark", mark_then_fail)
    with pytest.raises(RuntimeError, match="injected"):
        retention.delete_job(sessions, done, "t")
    whole = job(sessions, done)
    assert whole.deleted_at is None and whole.tombstone is None
    assert rows(sessions, done) == (50, 50)
    retention.require_results(whole)
    with sessions() as session:
        assert len(list(output.iter_output(session, done, errors=False))) == 50


def test_a_failure_while_purging_is_finished_by_the_sweep(sessions, settings,
                                                          monkeypatch) -> None:
    monkeypatch.setattr(retention, "PURGE_ROWS", 20)
    done = make_job(sessions, settings, 50, "q")
    finish(sessions, done)
    original = retention._purge_job_chunk
    calls = []

    def second_chunk_fails(session: Session, row: Job) -> bool:
        calls.append(row.id)
        if len(calls) == 2:
            raise RuntimeError("injected: the API process died mid-purge")
        return original(session, row)

    monkeypatch.setattr(retention, "_purge_job_chunk", second_chunk_fails)
    with pytest.raises(RuntimeError, match="injected"):
        retention.delete_job(sessions, done, "t")
    # The delete is done for every reader: its results are gone, although rows remain
    marked = job(sessions, done)
    with pytest.raises(ResultsDeleted, match="were deleted"):
        retention.require_results(marked)
    assert rows(sessions, done) == (30, 50) and marked.purged_at is None
    # And the sweep finishes what the request began
    monkeypatch.setattr(retention, "_purge_job_chunk", original)
    assert retention.sweep(sessions, budget_s=30).purged_jobs == 1
    assert rows(sessions, done) == (0, 0)


def test_delete_asks_to_cancel_a_running_job_and_hides_other_tenants(sessions,
                                                                      settings) -> None:
    running = make_job(sessions, settings, 5, "c")
    with pytest.raises(JobStateError, match="is in_progress: cancel it first"):
        retention.delete_job(sessions, running, "t")
    with pytest.raises(JobNotFound):
        retention.delete_job(sessions, running, "someone-else")
    jobs.cancel_job(sessions, running)
    deleted = retention.delete_job(sessions, running, "t")
    assert deleted.status == JobStatus.CANCELLED and deleted.purged_at is not None
    assert rows(sessions, running) == (0, 0)
    # Deleting it again gives the same tombstone
    assert retention.delete_job(sessions, running, "t").deleted_at == deleted.deleted_at


def test_calls_still_in_flight_keep_an_expired_job_from_deletion(sessions, settings) -> None:
    late = make_job(sessions, settings, 4, "l")
    claim(sessions, BatchRef(late, 1, 2), "worker-1", timedelta(seconds=60))
    with sessions.begin() as session:
        session.execute(update(Job).where(Job.id == late)
                        .values(expires_at=utcnow() - timedelta(seconds=1)))
    assert jobs.expire_overdue(sessions) == [late]
    with pytest.raises(JobStateError, match="calls still in flight"):
        retention.delete_job(sessions, late, "t")
    assert rows(sessions, late) == (0, 4)


def test_deleting_a_batch_output_file_deletes_its_results(sessions, settings) -> None:
    done = make_job(sessions, settings, 5, "o")
    finish(sessions, done)
    with pytest.raises(FileNotFound):
        retention.delete_file(sessions, files.output_file_id(done, errors=False), "other")
    retention.delete_file(sessions, files.output_file_id(done, errors=True), "t")
    assert rows(sessions, done) == (0, 0)
    with sessions() as session:
        for errors in (False, True):
            with pytest.raises(FileNotFound, match="deleted or expired"):
                files.virtual_file(session, files.output_file_id(done, errors), "t")
    with pytest.raises(JobStateError, match="results were deleted"):
        jobs.retry_failed(sessions, done, CollectingDispatcher(), settings)
    # A second delete of the file: it is gone, as at OpenAI
    with pytest.raises(FileNotFound):
        retention.delete_file(sessions, files.output_file_id(done, errors=False), "t")


def test_deleting_an_upload_removes_its_bytes_in_bounded_transactions(sessions,
                                                                      monkeypatch) -> None:
    monkeypatch.setattr(retention, "FILE_CHUNKS", 1)
    three, other = upload(sessions, chunks=3), upload(sessions, chunks=2)
    assert chunks_of(sessions, three) == (1, 3)
    with pytest.raises(FileNotFound):
        retention.delete_file(sessions, three, "someone-else")
    retention.delete_file(sessions, three, "t")
    assert chunks_of(sessions, three) == (0, 0) and chunks_of(sessions, other) == (1, 2)
    with pytest.raises(FileNotFound):
        retention.delete_file(sessions, three, "t")

"""Stored uploads and batches made from them, on the real Postgres: files span chunks and
read back byte for byte, an upload over the limit leaves nothing, and a batch made from a
multi-chunk file holds every line once."""

import io

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.compat import files, retention
from quotaflow.compat import openai_batches as batches
from quotaflow.config import Settings
from quotaflow.deployments.catalog import builtin_deployments
from quotaflow.dispatch.queues import CollectingDispatcher
from quotaflow.errors import FileNotFound, FileTooLarge
from quotaflow.jobs import service as jobs
from quotaflow.models import File, FileChunk, Item
from tests.harness.factories import chat_line, jsonl


def big_file(count: int) -> bytes:
    # lines of varying length, so line ends fall anywhere relative to chunk borders, and
    # distinct prompts, so that none is shared as an identical request
    return jsonl([chat_line(f"r-{i}", f"{i} " + "w" * (300 + i % 977)) for i in range(count)])


def test_a_multi_chunk_upload_reads_back_exactly(pg_sessions: sessionmaker[Session]) -> None:
    data = big_file(3000)
    assert len(data) > 2.5 * files.CHUNK_BYTES
    row = files.store_file(pg_sessions, io.BytesIO(data), tenant="t", filename="big.jsonl",
                           purpose="batch", max_bytes=len(data))
    assert row.bytes == len(data)
    with pg_sessions() as session:
        assert session.scalar(select(func.count()).select_from(FileChunk)
                              .where(FileChunk.file_id == row.id)) == 3
        assert b"".join(files.iter_chunks(session, row.id)) == data
        stream = files.open_stored(session, row.id)
        assert list(iter(stream.readline, b"")) == data.splitlines(keepends=True)


def test_an_upload_over_the_limit_leaves_nothing(pg_sessions: sessionmaker[Session]) -> None:
    data = big_file(2000)
    with pg_sessions() as session:
        before = session.scalar(select(func.count()).select_from(File))
    with pytest.raises(FileTooLarge, match="QUOTAFLOW_MAX_UPLOAD_BYTES"):
        files.store_file(pg_sessions, io.BytesIO(data), tenant="t", filename="x.jsonl",
                         purpose="batch", max_bytes=len(data) - 1)
    with pg_sessions() as session:
        assert session.scalar(select(func.count()).select_from(File)) == before


def test_a_missing_batch_output_file_is_not_found(pg_sessions: sessionmaker[Session]) -> None:
    # A batch's output files can be deleted (its results go: tests/cluster/test_retention.py); one
    # naming no batch of the tenant's is "not found".
    for file_id in ("file-out-batch_x", "file-err-batch_x"):
        with pytest.raises(FileNotFound):
            retention.delete_file(pg_sessions, file_id, tenant="t")


def test_a_batch_from_a_multi_chunk_file_holds_every_line(pg_sessions: sessionmaker[Session],
                                                          settings: Settings) -> None:
    data = big_file(3000)
    row = files.store_file(pg_sessions, io.BytesIO(data), tenant="t", filename="big.jsonl",
                           purpose="batch", max_bytes=len(data))
    dispatcher = CollectingDispatcher()
    request = batches.BatchRequest(input_file_id=row.id, endpoint="/v1/chat/completions",
                                   completion_window="2h", metadata=None, tenant="t")
    job = batches.create_batch(pg_sessions, request, settings=settings,
                               deployments=builtin_deployments(), dispatcher=dispatcher)
    with pg_sessions() as session:
        view = batches.batch_object(session, jobs.get_job(session, job.id))
        ids = session.scalars(select(Item.custom_id).where(Item.job_id == job.id)
                              .order_by(Item.line_no)).all()
    assert view["status"] == "in_progress" and view["completion_window"] == "2h"
    assert view["expires_at"] - view["created_at"] == 7200
    assert view["request_counts"] == {"total": 3000, "completed": 0, "failed": 0}
    assert ids == [f"r-{i}" for i in range(3000)]
    assert sum(ref.last_line - ref.first_line + 1 for ref in dispatcher.batches) == 3000
    assert job.enqueued_tokens and job.enqueued_tokens > 3000 * 12

"""A /v1 batch's `validating` is real: its row is committed before the file is read, seen
by other readers while the lines are stored, then `in_progress`, or `failed` (the same
batch) when the file is refused; a refused request leaves no batch; a batch left
validating by a dead API is failed by the sweep, one still being read is not."""

import io
import threading
import time
from datetime import timedelta

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.compat import files
from quotaflow.compat import openai_batches as batches
from quotaflow.config import Settings
from quotaflow.deployments.catalog import builtin_deployments
from quotaflow.dispatch.queues import CollectingDispatcher
from quotaflow.errors import EnqueuedTokenLimit
from quotaflow.ingest import pipeline as ingest
from quotaflow.models import Job, JobStatus, utcnow
from tests.harness.factories import chat_line, jsonl


def stored(sessions: sessionmaker[Session], data: bytes, tenant: str) -> str:
    return files.store_file(sessions, io.BytesIO(data), tenant=tenant, filename="in.jsonl",
                            purpose="batch", max_bytes=len(data)).id


def request(file_id: str, tenant: str) -> batches.BatchRequest:
    return batches.BatchRequest(input_file_id=file_id, endpoint="/v1/chat/completions",
                                completion_window="24h", metadata=None, tenant=tenant)


def create(sessions: sessionmaker[Session], settings: Settings, file_id: str,
           tenant: str) -> Job:
    return batches.create_batch(sessions, request(file_id, tenant), settings=settings,
                                deployments=builtin_deployments(),
                                dispatcher=CollectingDispatcher())


def batches_of(sessions: sessionmaker[Session], file_id: str) -> list[tuple[str, str]]:
    with sessions() as session:
        return [tuple(row) for row in session.execute(
            select(Job.id, Job.status).where(Job.input_file_id == file_id))]


def test_a_large_file_is_seen_validating_while_it_is_read(pg_sessions, settings) -> None:
    # Given an uploaded file of 20,000 distinct requests (about a second to store)
    data = jsonl([chat_line(f"v{i}", f"validate {i} " + "w" * (i % 300)) for i in range(20_000)])
    file_id = stored(pg_sessions, data, "val")
    made: list[Job] = []
    creating = threading.Thread(target=lambda: made.append(
        create(pg_sessions, settings, file_id, "val")))
    # When the batch is made while another reader polls the tenant's batches
    seen: list[str] = []
    creating.start()
    while creating.is_alive():
        seen.extend(status for _, status in batches_of(pg_sessions, file_id))
        time.sleep(0.005)
    creating.join()
    # Then the reader saw it validating, and then in progress with every line
    assert JobStatus.VALIDATING in seen, seen[:5]
    assert made[0].status == JobStatus.IN_PROGRESS and made[0].total == 20_000
    assert batches_of(pg_sessions, file_id) == [(made[0].id, JobStatus.IN_PROGRESS)]


def test_a_refused_file_fails_the_batch_that_was_validating(pg_sessions, settings) -> None:
    file_id = stored(pg_sessions, b'{not json\n{"custom_id": "x"}\n', "ref")
    failed = create(pg_sessions, settings, file_id, "ref")
    assert failed.status == JobStatus.FAILED and failed.failed_at is not None
    assert [e["line"] for e in failed.errors["data"]] == [1, 2]
    assert batches_of(pg_sessions, file_id) == [(failed.id, JobStatus.FAILED)]


def test_a_batch_refused_as_a_request_leaves_no_batch(pg_sessions, settings) -> None:
    settings.max_enqueued_tokens = 5
    file_id = stored(pg_sessions, jsonl([chat_line("q1", "a prompt of some length")]), "quota")
    with pytest.raises(EnqueuedTokenLimit):
        create(pg_sessions, settings, file_id, "quota")
    assert batches_of(pg_sessions, file_id) == []


def test_a_batch_left_validating_by_a_dead_api_fails(pg_sessions, settings) -> None:
    # Given two batches committed as validating ten minutes ago: one abandoned, one whose
    # file is still being read (its ingest holds the row)
    spec = ingest.JobSpec(queue="standard", tenant="dead")
    with pg_sessions.begin() as session:
        for job_id in ("batch_abandoned", "batch_reading"):
            ingest.insert_job(session, job_id, spec, settings, JobStatus.VALIDATING)
        session.execute(update(Job).where(Job.tenant == "dead")
                        .values(created_at=utcnow() - timedelta(minutes=10)))
    reading = pg_sessions()
    ingest.lock_validating(reading, "batch_reading")
    try:
        # When the sweep looks for abandoned validations
        assert batches.fail_abandoned(pg_sessions, timedelta(minutes=5)) == ["batch_abandoned"]
    finally:
        reading.rollback()
        reading.close()
    # Then only the abandoned one failed, saying why
    with pg_sessions() as session:
        abandoned = session.get_one(Job, "batch_abandoned")
        assert abandoned.status == JobStatus.FAILED
        assert "validation was cut off" in abandoned.errors["data"][0]["message"]
        assert session.get_one(Job, "batch_reading").status == JobStatus.VALIDATING
    # And a fresh one is left alone (its ingest may not hold it yet)
    assert batches.fail_abandoned(pg_sessions, timedelta(hours=1)) == []

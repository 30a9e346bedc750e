"""The job service and batch execution on a real PostgreSQL database."""

import asyncio
import io
import json
from datetime import timedelta

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.budget.buckets import LocalLimiter, RedisLimiter
from quotaflow.config import Settings
from quotaflow.dispatch.queues import BatchRef
from quotaflow.dispatch.reaper import reap
from quotaflow.errors import InputFileError, JobStateError
from quotaflow.execution import LIMITER_DOWN_BACKOFF_S, BatchExecutor
from quotaflow.ingest import pipeline
from quotaflow.jobs import service as jobs
from quotaflow.jobs import view as job_view
from quotaflow.models import Item, Job, JobStatus, Result, utcnow
from quotaflow.providers.mock import MockProvider
from quotaflow.results import output as downloads
from quotaflow.results.leases import claim, renew, store_many
from tests.harness.factories import chat_line, jsonl

HOUR = timedelta(hours=1)


class Collect:
    def __init__(self) -> None:
        self.batches: list[BatchRef] = []
        self.queues: list[str] = []

    def dispatch(self, queue: str, batches: list[BatchRef]) -> None:
        self.queues.append(queue)
        self.batches.extend(batches)


def create(sessions: sessionmaker[Session], settings: Settings, data: bytes,
           dispatcher: Collect | None = None) -> Job:
    return pipeline.create_job_in_process(
        sessions, io.BytesIO(data), settings=settings, deployments=settings.load_deployments(),
        dispatcher=dispatcher or Collect(), queue="bulk", filename="in.jsonl")


def executor(sessions: sessionmaker[Session], settings: Settings) -> BatchExecutor:
    return BatchExecutor(sessions, settings.load_deployments(), LocalLimiter(), settings)


def row_counts(sessions: sessionmaker[Session]) -> tuple[int, int, int]:
    with sessions() as session:
        return tuple(session.scalar(select(func.count()).select_from(model))
                     for model in (Job, Item, Result))


def test_job_is_stored_and_dispatched_in_batches(pg_sessions, settings) -> None:
    dispatcher = Collect()
    settings.batch_size = 10
    job = create(pg_sessions, settings, jsonl([chat_line(f"r{i}") for i in range(25)]), dispatcher)
    assert dispatcher.queues == ["bulk"]
    ranges = [(b.first_line, b.last_line) for b in dispatcher.batches]
    assert ranges == [(1, 10), (11, 20), (21, 25)]
    with pg_sessions() as session:
        view = job_view.job_object(session, jobs.get_job(session, job.id))
    assert view["status"] == JobStatus.IN_PROGRESS
    assert view["request_counts"] == {"total": 25, "completed": 0, "failed": 0, "pending": 25,
                                      "cancelled": 0, "expired": 0}


def test_bad_lines_become_failed_items_and_good_lines_run(pg_sessions, settings) -> None:
    # Given a file with one good line, one broken JSON line and one with a wrong method
    data = jsonl([chat_line("good"), "{oops", {**chat_line("bad-method"), "method": "GET"}])
    dispatcher = Collect()
    job = create(pg_sessions, settings, data, dispatcher)
    # When its batches run
    for ref in dispatcher.batches:
        executor(pg_sessions, settings).run(ref)
    # Then the good line succeeded and each bad line has an error naming its line
    with pg_sessions() as session:
        view = job_view.job_object(session, jobs.get_job(session, job.id))
        errors = [json.loads(line) for line in downloads.iter_output(session, job.id, errors=True)]
        output = [json.loads(line) for line in downloads.iter_output(session, job.id, errors=False)]
    assert view["status"] == JobStatus.COMPLETED
    assert view["request_counts"]["completed"] == 1 and view["request_counts"]["failed"] == 2
    assert [o["custom_id"] for o in output] == ["good"]
    assert [(e["custom_id"], e["error"]["line"]) for e in errors] == [(None, 2), ("bad-method", 3)]
    assert "not valid JSON" in errors[0]["error"]["message"]
    assert 'method must be "POST"' in errors[1]["error"]["message"]


@pytest.mark.parametrize(("data", "message"), [
    (b"", "the file is empty"),
    (b"\n\n", "the file is empty"),
    (b"{bad\n[1]\n", "no line of the file is a valid request"),
    (jsonl([chat_line(f"r{i}") for i in range(1500)] + [chat_line("r7")]),
     "duplicate custom_id 'r7' on lines 8 and 1501"),
])
def test_rejected_file_writes_nothing(pg_sessions, settings, data: bytes, message: str) -> None:
    with pytest.raises(InputFileError, match=message):
        create(pg_sessions, settings, data)
    assert row_counts(pg_sessions) == (0, 0, 0)


def test_file_over_size_limit_is_refused_while_streaming(pg_sessions, settings) -> None:
    settings.max_file_bytes = 5_000
    with pytest.raises(InputFileError, match="larger than the limit of 5000 bytes"):
        create(pg_sessions, settings, jsonl([chat_line(f"r{i}") for i in range(200)]))
    assert row_counts(pg_sessions) == (0, 0, 0)


def test_unrouted_model_is_a_line_error(pg_sessions, settings, tmp_path) -> None:
    (tmp_path / "d.toml").write_text(
        '[deployments.only]\nprovider = "mock"\nmodel = "small"\nrpm = 10\ntpm = 1000\n')
    settings.deployments_file = tmp_path / "d.toml"
    job = create(pg_sessions, settings, jsonl([chat_line("a", model="small"),
                                               chat_line("b", model="huge")]))
    with pg_sessions() as session:
        [error] = [json.loads(line) for line in downloads.iter_output(session, job.id, errors=True)]
    assert error["custom_id"] == "b"
    assert "no deployment serves model 'huge'" in error["error"]["message"]


def test_concurrent_claims_never_share_an_item(pg_sessions, settings) -> None:
    job = create(pg_sessions, settings, jsonl([chat_line(f"r{i}") for i in range(50)]))
    ref = BatchRef(job.id, 1, 50)
    first = claim(pg_sessions, ref, "w1", timedelta(seconds=60))
    second = claim(pg_sessions, ref, "w2", timedelta(seconds=60))
    assert len(first) == 50 and second == []


def test_expired_lease_is_claimed_again(pg_sessions, settings) -> None:
    job = create(pg_sessions, settings, jsonl([chat_line("r0"), chat_line("r1")]))
    ref = BatchRef(job.id, 1, 2)
    assert len(claim(pg_sessions, ref, "dead-worker", timedelta(seconds=-1))) == 2
    again = claim(pg_sessions, ref, "w2", timedelta(seconds=60))
    assert [item.attempts for item in again] == [2, 2]


def test_batch_run_twice_keeps_one_result_per_item(pg_sessions, settings) -> None:
    # Given a batch whose first run was cut off after claiming (its worker died)
    dispatcher = Collect()
    job = create(pg_sessions, settings, jsonl([chat_line(f"r{i}") for i in range(5)]), dispatcher)
    [ref] = dispatcher.batches
    claim(pg_sessions, ref, "dead-worker", timedelta(seconds=-1))
    # When two workers run the redelivered batch at the same time
    run = executor(pg_sessions, settings)

    async def both() -> None:
        await asyncio.gather(run.run_async(ref), run.run_async(ref))

    asyncio.run(both())
    # Then each item has exactly one result and the job is complete
    with pg_sessions() as session:
        per_item = session.execute(select(Result.line_no, func.count())
                                   .group_by(Result.line_no)).all()
        status = jobs.get_job(session, job.id).status
    assert sorted(per_item) == [(n, 1) for n in range(1, 6)]
    assert status == JobStatus.COMPLETED


def test_leased_items_ask_for_a_later_retry(pg_sessions, settings) -> None:
    job = create(pg_sessions, settings, jsonl([chat_line("r0")]))
    ref = BatchRef(job.id, 1, 1)
    claim(pg_sessions, ref, "other-worker", timedelta(seconds=30))
    report = executor(pg_sessions, settings).run(ref)
    assert report.claimed == 0
    assert report.retry_in is not None and 25 < report.retry_in <= 32


def test_cancel_stops_pending_items_and_keeps_finished_ones(pg_sessions, settings) -> None:
    dispatcher = Collect()
    settings.batch_size = 5
    job = create(pg_sessions, settings, jsonl([chat_line(f"r{i}") for i in range(15)]), dispatcher)
    executor(pg_sessions, settings).run(dispatcher.batches[0])
    running = claim(pg_sessions, dispatcher.batches[1], "busy", timedelta(seconds=60))

    cancelled = jobs.cancel_job(pg_sessions, job.id)
    assert cancelled.status == JobStatus.CANCELLING  # the claimed batch is still in flight
    assert executor(pg_sessions, settings).run(dispatcher.batches[2]).claimed == 0

    # the in-flight batch finishes and keeps its results
    answers = [asyncio.run(MockProvider().send("/v1/chat/completions", item.body))
               for item in running]
    assert store_many(pg_sessions, job.id, list(zip(running, answers, strict=True))) == (5, 0)
    jobs.finish_if_done(pg_sessions, job.id)
    with pg_sessions() as session:
        view = job_view.job_object(session, jobs.get_job(session, job.id))
        errors = [json.loads(line) for line in downloads.iter_output(session, job.id, errors=True)]
    assert view["status"] == JobStatus.CANCELLED
    assert view["request_counts"]["completed"] == 10 and view["request_counts"]["cancelled"] == 5
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert len(errors) == 5


def test_finished_job_cannot_be_cancelled(pg_sessions, settings) -> None:
    job = create(pg_sessions, settings, jsonl([chat_line("x")]))
    executor(pg_sessions, settings).run(BatchRef(job.id, 1, 1))
    with pytest.raises(JobStateError, match="is completed and can no longer be cancelled"):
        jobs.cancel_job(pg_sessions, job.id)


def test_limiter_down_gives_the_batch_back_and_it_resumes(pg_sessions, settings,
                                                           throwaway_redis) -> None:
    # Given a job whose workers share a limiter on a Redis that then goes away
    url, start, stop = throwaway_redis
    dispatcher = Collect()
    job = create(pg_sessions, settings, jsonl([chat_line(f"r{i}") for i in range(5)]), dispatcher)
    [ref] = dispatcher.batches
    run = BatchExecutor(pg_sessions, settings.load_deployments(), RedisLimiter(url), settings)
    stop()
    # When its batch runs, nothing is sent: the items go back and the batch asks to wait
    report = run.run(ref)
    assert report.claimed == 5 and report.succeeded == report.failed == 0
    assert report.retry_in == LIMITER_DOWN_BACKOFF_S
    with pg_sessions() as session:
        items = session.scalars(select(Item).where(Item.job_id == job.id)).all()
        assert {(i.status, i.attempts) for i in items} == {("pending", 0)}
        assert session.scalar(select(func.count()).select_from(Result)) == 0
    # Then, once Redis is back, the same batch completes
    start()
    assert run.run(ref).succeeded == 5
    with pg_sessions() as session:
        assert jobs.get_job(session, job.id).status == JobStatus.COMPLETED


def small_deployment(settings, tmp_path, tpm: int) -> None:
    (tmp_path / "d.toml").write_text(
        f'[deployments.small]\nprovider = "mock"\nmodel = "small"\nrpm = 6000\ntpm = {tpm}\n'
        'reconcile_usage = false\nsafety_margin_s = 0\n[routes]\n"*" = "small"\n')
    settings.deployments_file = tmp_path / "d.toml"


def test_the_route_is_decided_at_ingest_and_execution_follows_it(pg_sessions, settings,
                                                                 tmp_path) -> None:
    (tmp_path / "d.toml").write_text(
        '[deployments.one]\nprovider = "mock"\nmodel = "small"\nrpm = 6000\ntpm = 600000\n'
        '[deployments.two]\nprovider = "mock"\nmodel = "other"\nrpm = 6000\ntpm = 600000\n'
        '[routes]\n"*" = "one"\n')
    settings.deployments_file = tmp_path / "d.toml"
    dispatcher = Collect()
    job = create(pg_sessions, settings, jsonl([chat_line("a", model="small"),
                                               chat_line("b", model="big"),
                                               chat_line("c", model="gone")]), dispatcher)
    with pg_sessions.begin() as session:
        stored = dict(session.execute(select(Item.custom_id, Item.route)
                                      .where(Item.job_id == job.id)).all())
        assert stored == {"a": "small", "b": "*", "c": "*"}
        # A route stored at ingest is followed, not decided again from the model; one
        # the deployments file no longer has fails its items with the reason
        session.execute(update(Item).where(Item.job_id == job.id, Item.custom_id == "b")
                        .values(route="other"))
        session.execute(update(Item).where(Item.job_id == job.id, Item.custom_id == "c")
                        .values(route="removed"))
    report = executor(pg_sessions, settings).run(dispatcher.batches[0])
    assert (report.succeeded, report.failed) == (2, 1)
    with pg_sessions() as session:
        output = {line["custom_id"]: line for line in map(
            json.loads, downloads.iter_output(session, job.id, errors=False))}
        [error] = [json.loads(line) for line in downloads.iter_output(session, job.id, errors=True)]
    assert output["b"]["response"]["body"]["model"] == "other"  # sent where its route says
    assert output["a"]["response"]["body"]["model"] == "small"
    assert error["custom_id"] == "c" and error["error"]["code"] == "no_deployment"
    assert "route 'removed' is no longer in the deployments file" in error["error"]["message"]


def test_request_larger_than_the_bucket_fails_at_once(pg_sessions, settings, tmp_path) -> None:
    small_deployment(settings, tmp_path, tpm=600)  # 600 tokens of capacity
    dispatcher = Collect()
    job = create(pg_sessions, settings, jsonl([chat_line("fits", max_tokens=100),
                                               chat_line("huge", max_tokens=5000)]), dispatcher)
    report = executor(pg_sessions, settings).run(dispatcher.batches[0])
    assert (report.succeeded, report.failed, report.retry_in) == (1, 1, None)
    with pg_sessions() as session:
        [error] = [json.loads(line) for line in downloads.iter_output(session, job.id, errors=True)]
    assert error["custom_id"] == "huge" and error["error"]["code"] == "request_too_large"
    assert "admits at most 600 at once" in error["error"]["message"]


def test_a_long_wait_gives_the_rest_back_to_the_queue(pg_sessions, settings, tmp_path) -> None:
    # Given a deployment whose bucket holds two 253-token requests
    small_deployment(settings, tmp_path, tpm=600)  # 600 tokens, refilling 10 a second
    settings.batch_size = 5
    dispatcher = Collect()
    job = create(pg_sessions, settings,
                 jsonl([chat_line(f"r{i}", max_tokens=250) for i in range(5)]), dispatcher)
    # When the (bulk) batch runs: one fits at once, the next after a short inline wait
    # (bulk keeps 20% of the bucket), and the third would wait another 253 / 10 s
    report = executor(pg_sessions, settings).run(dispatcher.batches[0])
    # Then the rest go back to pending and the batch asks to be retried when they fit
    assert report.succeeded == 2
    assert report.retry_in is not None and 20 < report.retry_in < 27
    with pg_sessions() as session:
        statuses = sorted(session.scalars(select(Item.status).where(Item.job_id == job.id)))
    assert statuses == ["pending", "pending", "pending", "succeeded", "succeeded"]


def test_reaper_requeues_only_expired_leases(pg_sessions, settings) -> None:
    # Given one batch claimed by a dead worker (lease over) and one by a live worker
    settings.batch_size = 3
    first = Collect()
    job = create(pg_sessions, settings, jsonl([chat_line(f"r{i}") for i in range(6)]), first)
    dead, live = first.batches
    claim(pg_sessions, dead, "dead-worker", timedelta(seconds=-1))
    claim(pg_sessions, live, "live-worker", timedelta(seconds=60))
    # When the reaper runs
    again = Collect()
    assert reap(pg_sessions, again, batch_size=10, patience=HOUR) == 3
    # Then only the dead worker's items are pending again, in one new message on the job's queue
    assert again.queues == ["bulk"]
    assert again.batches == [BatchRef(job.id, 1, 3)]
    with pg_sessions() as session:
        statuses = dict(session.execute(select(Item.line_no, Item.status)
                                        .where(Item.job_id == job.id)).all())
    assert statuses == {1: "pending", 2: "pending", 3: "pending",
                        4: "running", 5: "running", 6: "running"}
    assert reap(pg_sessions, Collect(), batch_size=10, patience=HOUR) == 0


def test_reaper_resends_pending_items_whose_message_was_lost(pg_sessions, settings) -> None:
    # Given a job whose queue messages were lost (say, Redis restarted empty)
    settings.queue_patience_s = 60
    job = create(pg_sessions, settings, jsonl([chat_line(f"r{i}") for i in range(3)]))
    assert reap(pg_sessions, Collect(), batch_size=10, patience=HOUR) == 0  # still patient
    with pg_sessions.begin() as session:  # the patience has run out
        session.execute(update(Item).where(Item.job_id == job.id)
                        .values(lease_expires_at=utcnow() - timedelta(seconds=1)))
    # When the reaper runs, the items are sent again, and not again until patience passes
    again = Collect()
    assert reap(pg_sessions, again, batch_size=10, patience=HOUR) == 3
    assert again.batches == [BatchRef(job.id, 1, 3)]
    assert reap(pg_sessions, Collect(), batch_size=10, patience=HOUR) == 0


def test_a_broker_restart_sends_every_pending_item_again_at_once(pg_sessions,
                                                                settings) -> None:
    # Given a job whose items are pending, well within their queue patience, and one
    # item held by a live worker
    job = create(pg_sessions, settings, jsonl([chat_line(f"r{i}") for i in range(4)]))
    claim(pg_sessions, BatchRef(job.id, 4, 4), "live-worker", timedelta(seconds=60))
    assert reap(pg_sessions, Collect(), batch_size=10, patience=HOUR) == 0
    # When the broker restarted, so their messages may be gone
    again = Collect()
    assert reap(pg_sessions, again, batch_size=10, patience=HOUR, messages_lost=True) == 3
    # Then the pending ones are queued again now, the live worker's are left to it
    assert again.batches == [BatchRef(job.id, 1, 3)]


def test_a_running_batch_renews_its_leases(pg_sessions, settings) -> None:
    job = create(pg_sessions, settings, jsonl([chat_line("r0")]))
    [item] = claim(pg_sessions, BatchRef(job.id, 1, 1), "me", timedelta(seconds=1))
    assert renew(pg_sessions, job.id, "me", timedelta(seconds=600)) == 1
    assert renew(pg_sessions, job.id, "someone-else", timedelta(seconds=600)) == 0
    assert reap(pg_sessions, Collect(), batch_size=10, patience=HOUR) == 0
    assert item.line_no == 1


def test_retry_runs_failed_requests_again_but_not_invalid_lines(pg_sessions, settings,
                                                                 tmp_path) -> None:
    # Given a completed job with one request the provider refused and one invalid line
    small_deployment(settings, tmp_path, tpm=600)
    first = Collect()
    job = create(pg_sessions, settings, jsonl([chat_line("ok"), chat_line("big", max_tokens=900),
                                               "not json"]), first)
    executor(pg_sessions, settings).run(first.batches[0])
    with pg_sessions() as session:
        assert jobs.get_job(session, job.id).status == JobStatus.COMPLETED
    # When its failed requests are retried against a larger deployment
    small_deployment(settings, tmp_path, tpm=6000)
    again = Collect()
    settings.batch_size = 10
    assert jobs.retry_failed(pg_sessions, job.id, again, settings) == 1
    assert again.batches == [BatchRef(job.id, 2, 2)]
    with pg_sessions() as session:
        assert jobs.get_job(session, job.id).status == JobStatus.IN_PROGRESS
    executor(pg_sessions, settings).run(again.batches[0])
    # Then the retried request succeeds, once; the invalid line stays failed
    with pg_sessions() as session:
        view = job_view.job_object(session, jobs.get_job(session, job.id))
        output = [json.loads(line)["custom_id"] for line in downloads.iter_output(session, job.id,
                                                                              errors=False)]
    assert view["status"] == JobStatus.COMPLETED
    assert output == ["ok", "big"]
    assert view["request_counts"]["failed"] == 1


def test_jobs_past_their_completion_window_expire(pg_sessions, settings) -> None:
    settings.completion_window_s = 1
    settings.batch_size = 2
    dispatcher = Collect()
    job = create(pg_sessions, settings, jsonl([chat_line(f"r{i}") for i in range(4)]), dispatcher)
    executor(pg_sessions, settings).run(dispatcher.batches[0])
    with pg_sessions.begin() as session:  # the window has passed
        session.get(Job, job.id).expires_at = utcnow() - timedelta(seconds=1)
    assert jobs.expire_overdue(pg_sessions) == [job.id]
    assert executor(pg_sessions, settings).run(dispatcher.batches[1]).claimed == 0
    with pg_sessions() as session:
        view = job_view.job_object(session, jobs.get_job(session, job.id))
        errors = [json.loads(line) for line in downloads.iter_output(session, job.id, errors=True)]
    assert view["status"] == "expired" and view["expired_at"] is not None
    assert view["request_counts"]["completed"] == 2 and view["request_counts"]["expired"] == 2
    assert [e["error"]["code"] for e in errors] == ["batch_expired", "batch_expired"]
    assert jobs.expire_overdue(pg_sessions) == []

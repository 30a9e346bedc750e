"""Placement: a local deployment's batches reach its own queues, on creation and when the
reaper queues them again; everything else stays on the priority queues."""

import io
from datetime import timedelta
from pathlib import Path

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.config import Settings
from quotaflow.deployments.catalog import Deployments, load_deployments
from quotaflow.dispatch.queues import BatchRef, PlacingDispatcher
from quotaflow.dispatch.reaper import reap
from quotaflow.ingest import pipeline
from quotaflow.jobs import service as jobs
from quotaflow.models import Item
from tests.harness.factories import chat_line, jsonl

DEPLOYMENTS = """
[deployments.gpu0]
provider = "local"
model = "qwen"
model_path = "/models/qwen"
rpm = 6000
tpm = 600000

[deployments.remote]
provider = "mock"
model = "m"
rpm = 6000
tpm = 600000

[routes]
"qwen" = "gpu0"
"*" = "remote"
"""


class Recording:
    """Keeps what would have been sent, per queue."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, BatchRef]] = []

    def dispatch(self, queue: str, batches: list[BatchRef]) -> None:
        self.sent.extend((queue, ref) for ref in batches)

    def ranges(self) -> list[tuple[str, int, int]]:
        return sorted(((q, r.first_line, r.last_line) for q, r in self.sent),
                      key=lambda x: x[1])


def deployments(tmp_path: Path, text: str = DEPLOYMENTS) -> Deployments:
    path = tmp_path / "deployments.toml"
    path.write_text(text)
    return load_deployments(path)


def mixed_file() -> bytes:
    """Lines 1-10 for the local model, 11-15 for the remote one, 16 invalid, 17-25 local."""
    lines: list[dict | str] = [chat_line(f"a{i}", model="qwen") for i in range(10)]
    lines += [chat_line(f"b{i}", model="m") for i in range(5)]
    lines.append("{not json")
    lines += [chat_line(f"c{i}", model="qwen") for i in range(9)]
    return jsonl(lines)


def create(sessions: sessionmaker[Session], settings: Settings, placed: Deployments,
           dispatcher: Recording) -> str:
    settings = settings.model_copy(update={"batch_size": 10})
    job = pipeline.create_job_in_process(
        sessions, io.BytesIO(mixed_file()), settings=settings, deployments=placed, queue="bulk",
        dispatcher=PlacingDispatcher(dispatcher, sessions, placed))
    return job.id


def test_batches_are_split_into_runs_bound_for_one_queue(
        pg_sessions: sessionmaker[Session], settings: Settings, tmp_path: Path) -> None:
    recording = Recording()
    job_id = create(pg_sessions, settings, deployments(tmp_path), recording)
    # batches of 10 valid lines: 1-10, 11-21 (16 is invalid), 22-25
    assert recording.ranges() == [("local.gpu0.bulk", 1, 10), ("bulk", 11, 15),
                                  ("local.gpu0.bulk", 17, 21), ("local.gpu0.bulk", 22, 25)]
    assert {r.job_id for _, r in recording.sent} == {job_id}


def test_without_local_deployments_nothing_changes(
        pg_sessions: sessionmaker[Session], settings: Settings, tmp_path: Path) -> None:
    remote_only = deployments(tmp_path, "[deployments.remote]" + DEPLOYMENTS.split(
        "[deployments.remote]")[1].replace('"qwen" = "gpu0"\n', ""))
    recording = Recording()
    create(pg_sessions, settings, remote_only, recording)
    assert recording.ranges() == [("bulk", 1, 10), ("bulk", 11, 21), ("bulk", 22, 25)]


def test_the_reaper_queues_local_work_again_on_the_local_queue(
        pg_sessions: sessionmaker[Session], settings: Settings, tmp_path: Path) -> None:
    # Given a job whose queue messages were lost (its items waited past their patience)
    placed = deployments(tmp_path)
    job_id = create(pg_sessions, settings, placed, Recording())
    with pg_sessions.begin() as session:
        session.execute(update(Item).where(Item.job_id == job_id, Item.line_no >= 9)
                        .values(lease_expires_at=jobs.utcnow() - timedelta(seconds=1)))
    # When the reaper sends them again
    again = Recording()
    requeued = reap(pg_sessions, PlacingDispatcher(again, pg_sessions, placed), 10,
                    timedelta(hours=1))
    # Then each goes where it went the first time
    assert requeued == 16
    assert again.ranges() == [("local.gpu0.bulk", 9, 10), ("bulk", 11, 15),
                              ("local.gpu0.bulk", 17, 19), ("local.gpu0.bulk", 20, 25)]


def test_placement_reads_the_route_stored_at_ingest(
        pg_sessions: sessionmaker[Session], settings: Settings, tmp_path: Path) -> None:
    placed = deployments(tmp_path)
    job_id = create(pg_sessions, settings, placed, Recording())
    with pg_sessions.begin() as session:
        # Lines 11-15 (model "m") stored as routed to the local model, lines 1-5 as items
        # stored before routes were (routed by their model, as before)
        session.execute(update(Item).where(Item.job_id == job_id, Item.line_no.between(11, 15))
                        .values(route="qwen"))
        session.execute(update(Item).where(Item.job_id == job_id, Item.line_no <= 5)
                        .values(route=None))
    again = Recording()
    PlacingDispatcher(again, pg_sessions, placed).dispatch("bulk", [BatchRef(job_id, 1, 25)])
    assert again.ranges() == [("local.gpu0.bulk", 1, 25)]

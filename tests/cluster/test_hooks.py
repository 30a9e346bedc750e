"""Batch hooks through the executor, against PostgreSQL: a hook that sends a batch back
before it claims anything, and items a hook finishes stored and never called (the hook
list's own rules: tests/unit/execution/test_hooks.py)."""

import io
import json
from pathlib import Path

from quotaflow.budget.buckets import LocalLimiter
from quotaflow.dispatch.queues import BatchRef
from quotaflow.execution import BatchExecutor
from quotaflow.execution.hooks import BatchHook, Hooks
from quotaflow.ingest import pipeline
from quotaflow.models import Item, ItemStatus
from quotaflow.results import output
from tests.harness.factories import chat_line, jsonl
from tests.unit.execution.test_hooks import Recorder

# --- through the executor, against PostgreSQL -------------------------------------------

def _job(pg_sessions, settings, tmp_path: Path, lines: int) -> tuple[str, BatchRef]:
    (tmp_path / "d.toml").write_text(
        '[deployments.one]\nprovider = "mock"\nmodel = "gpt-4o-mini"\nrpm = 60000\n'
        'tpm = 6000000\n[routes]\n"*" = "one"\n')
    settings.deployments_file = tmp_path / "d.toml"
    settings.batch_size = lines
    batches: list[BatchRef] = []

    class Collect:
        def dispatch(self, queue: str, refs: list[BatchRef]) -> None:
            batches.extend(refs)

    job = pipeline.create_job_in_process(
        pg_sessions, io.BytesIO(jsonl([chat_line(f"h{i}") for i in range(lines)])),
        settings=settings, deployments=settings.load_deployments(), dispatcher=Collect(),
        queue="standard")
    return job.id, batches[0]


def _with_hooks(executor: BatchExecutor, *extra: BatchHook) -> None:
    """The executor's runs get `extra` in front of the hooks the settings give them."""
    made = executor.policies.hooks_for
    executor.policies.hooks_for = lambda job: Hooks([*extra, *made(job).hooks])  # type: ignore[method-assign]


def test_a_hook_can_send_a_batch_back_before_it_claims_anything(pg_sessions, settings,
                                                                tmp_path) -> None:
    # Given a batch of 5 and a hook that says "not now, in 3 s"
    job_id, batch = _job(pg_sessions, settings, tmp_path, 5)
    executor = BatchExecutor(pg_sessions, settings.load_deployments(), LocalLimiter(), settings)
    journal: list[str] = []
    _with_hooks(executor, Recorder("gate", journal, come_back_in=3.0))
    # When it runs
    report = executor.run(batch)
    # Then it claimed nothing, comes back in 3 s, and no later point was reached
    assert (report.claimed, report.retry_in) == (0, 3.0)
    assert journal == ["gate.before_claim"]
    with pg_sessions() as session:
        statuses = {item.status for item in session.query(Item).filter_by(job_id=job_id)}
    assert statuses == {ItemStatus.PENDING}


def test_items_a_hook_finishes_are_stored_and_never_called(pg_sessions, settings,
                                                          tmp_path) -> None:
    # Given a batch of 6 and a hook that keeps 2 to call and finishes the other 4
    job_id, batch = _job(pg_sessions, settings, tmp_path, 6)
    executor = BatchExecutor(pg_sessions, settings.load_deployments(), LocalLimiter(), settings)
    journal: list[str] = []
    _with_hooks(executor, Recorder("take", journal, keep=2))
    # When it runs
    report = executor.run(batch)
    # Then 2 were called and answered, 4 stored with the hook's failure, and the hook
    # was told the run stopped
    assert (report.claimed, report.succeeded, report.failed) == (6, 2, 4)
    assert journal == ["take.before_claim", "take.claimed 6", "take.on_stop"]
    with pg_sessions() as session:
        errors = [json.loads(line) for line in output.iter_output(session, job_id,
                                                                  errors=True)]
    assert sorted(e["custom_id"] for e in errors) == ["h2", "h3", "h4", "h5"]
    assert {e["error"]["message"] for e in errors} == {"taken by take"}

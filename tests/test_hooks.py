"""A batch run's hooks (quotaflow/execution/hooks.py): called in order, only where a hook
uses the point; a hook can stop a run before it claims, or finish items so they are never
called; the run's policies are chosen from the settings in one place (policies/)."""

import io
import json
from pathlib import Path

import pytest

from quotaflow import jobs, output
from quotaflow.config import Settings
from quotaflow.deployments import Deployments
from quotaflow.dispatch import BatchRef
from quotaflow.execution import BatchExecutor
from quotaflow.execution.batch import BatchRun
from quotaflow.execution.facts import JobFacts
from quotaflow.execution.hooks import BatchHook, Hooks
from quotaflow.execution.policies import Policies
from quotaflow.fairshare import NoFairShare
from quotaflow.leases import ClaimedItem
from quotaflow.limiters import LocalLimiter
from quotaflow.models import Item, ItemStatus
from quotaflow.outcomes import Failure, FailureCode
from tests.factories import chat_line, jsonl


class Recorder(BatchHook):
    """Writes each point it is asked at to a shared journal, under its name."""

    def __init__(self, name: str, journal: list[str], come_back_in: float | None = None,
                 keep: int | None = None) -> None:
        self.name, self.journal = name, journal
        self.come_back_in, self.keep = come_back_in, keep

    def before_claim(self) -> float | None:
        self.journal.append(f"{self.name}.before_claim")
        return self.come_back_in

    def claimed(self, run: BatchRun, items: list[ClaimedItem]) -> list[ClaimedItem]:
        self.journal.append(f"{self.name}.claimed {len(items)}")
        if self.keep is None:
            return items
        for item in items[self.keep:]:
            run.finish(item, Failure(FailureCode.INVALID_REQUEST, f"taken by {self.name}"))
        return items[:self.keep]

    def on_stop(self, run: BatchRun) -> None:
        self.journal.append(f"{self.name}.on_stop")


class Failing(BatchHook):
    def on_stop(self, run: BatchRun) -> None:
        raise RuntimeError("stop failed")


def test_each_point_lists_only_the_hooks_that_use_it_in_their_order() -> None:
    # Given a recorder, a hook that overrides nothing, and another recorder
    journal: list[str] = []
    first, idle, second = Recorder("a", journal), BatchHook(), Recorder("b", journal)
    # When they become a run's hooks
    hooks = Hooks([first, idle, second])
    # Then each point holds the recorders' methods in order, and no point the idle hook
    assert hooks.claimed == (first.claimed, second.claimed)
    assert hooks.on_stop == (first.on_stop, second.on_stop)
    # And points nobody uses are empty: the loop makes no call for them
    assert hooks.call_ended == hooks.before_acquire == hooks.before_store == ()
    assert hooks.ledger is None


def test_a_hook_that_gives_way_stops_the_run_before_the_later_hooks_are_asked() -> None:
    # Given three hooks, the second of which says "come back in 2 s"
    journal: list[str] = []
    hooks = Hooks([Recorder("a", journal), Recorder("b", journal, come_back_in=2.0),
                   Recorder("c", journal, come_back_in=9.0)])
    # When the run asks whether to claim
    # Then the first answer stands and the third hook is never asked
    assert hooks.come_back_in() == 2.0
    assert journal == ["a.before_claim", "b.before_claim"]


def test_claimed_items_pass_the_hooks_in_order_and_stop_once_none_are_left() -> None:
    # Given hooks keeping 2 of the items, then none, then all
    journal: list[str] = []
    finished: list[int] = []
    run = _Run(finished)
    hooks = Hooks([Recorder("a", journal, keep=2), Recorder("b", journal, keep=0),
                   Recorder("c", journal)])
    # When 5 claimed items go through them
    left = hooks.to_call(run, [_item(n) for n in range(5)])  # type: ignore[arg-type]
    # Then each saw what the one before left, the last was not asked, and every item
    # taken out was finished
    assert left == []
    assert journal == ["a.claimed 5", "b.claimed 2"]
    assert sorted(finished) == [0, 1, 2, 3, 4]


def test_on_stop_runs_last_hook_first_and_every_one_even_when_one_raises() -> None:
    journal: list[str] = []
    hooks = Hooks([Recorder("a", journal), Failing(), Recorder("c", journal)])
    with pytest.raises(RuntimeError, match="stop failed"):
        hooks.stop(_Run([]))  # type: ignore[arg-type]
    assert journal == ["c.on_stop", "a.on_stop"]


def _facts(queue: str) -> JobFacts:
    return JobFacts("/v1/chat/completions", queue, None, "t", False, "openai", 1.0)


class _Fair(NoFairShare):
    """A fair-share store that is not the no-op one."""


def _deployments(tmp_path: Path, extra: str = "") -> Deployments:
    (tmp_path / "d.toml").write_text(
        '[deployments.one]\nprovider = "mock"\nmodel = "m"\nrpm = 6000\ntpm = 600000\n'
        + extra + '[routes]\n"*" = "one"\n')
    return Settings(deployments_file=tmp_path / "d.toml").load_deployments()


def test_policies_give_a_run_only_the_hooks_whose_policy_is_on_for_it(tmp_path) -> None:
    names = lambda hooks: [type(hook).__name__ for hook in hooks]  # noqa: E731
    deployments = _deployments(tmp_path)
    settings = Settings(dedup_across_jobs=True)
    # Given fair shares, reuse across jobs on, no prices and no batch deployment
    policies = Policies(None, deployments, settings, _Fair(), True)  # type: ignore[arg-type]
    # Then a bulk run gets fair shares, reuse and metrics, in that order; realtime no fair
    assert names(policies.hooks_for(_facts("bulk"))) == ["FairShareHook", "ReuseHook",
                                                         "MetricsHook"]
    assert names(policies.hooks_for(_facts("realtime"))) == ["ReuseHook", "MetricsHook"]
    # And with everything off, only the metrics tally is left
    bare = Policies(None, deployments, Settings(), NoFairShare(), True)  # type: ignore[arg-type]
    assert names(bare.hooks_for(_facts("bulk"))) == ["MetricsHook"]
    # And each run gets hooks of its own (they keep the run's state)
    first, second = policies.hooks_for(_facts("bulk")), policies.hooks_for(_facts("bulk"))
    assert first.hooks[0] is not second.hooks[0]


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

    job = jobs.create_job(pg_sessions, io.BytesIO(jsonl([chat_line(f"h{i}")
                                                         for i in range(lines)])),
                          settings=settings, deployments=settings.load_deployments(),
                          dispatcher=Collect(), queue="standard")
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


class _Run:
    """What `claimed` needs of a run: somewhere to finish items."""

    def __init__(self, finished: list[int]) -> None:
        self.finished = finished

    def finish(self, item: "_Item", outcome: object, provenance: object = None) -> None:
        self.finished.append(item.line_no)


class _Item:
    def __init__(self, line_no: int) -> None:
        self.line_no = line_no


def _item(line_no: int) -> _Item:
    return _Item(line_no)

"""A batch run's hooks (quotaflow/execution/hooks.py): called in order, only where a hook
uses the point; a hook can stop a run before it claims, or finish items so they are never
called; the run's policies are chosen from the settings in one place (policies/)."""

from pathlib import Path

import pytest

from quotaflow.budget.fair_share import NoFairShare
from quotaflow.config import Settings
from quotaflow.deployments.catalog import Deployments
from quotaflow.execution.batch import BatchRun
from quotaflow.execution.facts import JobFacts
from quotaflow.execution.hooks import BatchHook, Hooks
from quotaflow.execution.policies import Policies
from quotaflow.providers.outcomes import Failure, FailureCode
from quotaflow.results.leases import ClaimedItem


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
    assert hooks.on_stored is None


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
    # And where nothing serves the counts (a worker without a metrics port), not even that
    unserved = Policies(None, deployments, Settings(), NoFairShare(), True,  # type: ignore[arg-type]
                        metrics=False)
    assert names(unserved.hooks_for(_facts("bulk"))) == []
    # And each run gets hooks of its own (they keep the run's state)
    first, second = policies.hooks_for(_facts("bulk")), policies.hooks_for(_facts("bulk"))
    assert first.hooks[0] is not second.hooks[0]


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

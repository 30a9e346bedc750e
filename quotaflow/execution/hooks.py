"""The one seam for batch policies: a run carries an ordered list of hooks.

Fair shares, cross-job reuse, provider-batch offload, the spend switch and the
metrics tally each used to be a branch of the executor or the admission loop;
adding a policy meant editing the loop. Now a policy is a `BatchHook` subclass
that overrides the points it needs (every point is a no-op here), and
`policies/__init__.py` (the one place that reads the settings for them) makes a
run's hooks when the run starts, leaving out those whose policy is off for it.

The points, in the order a run meets them:

- `before_claim()`: seconds to come back in instead of claiming (a hook that
  stops the run before it starts: the first one to say so wins);
- `claimed(run, items)`: the items still to call (a hook may finish some);
- `stop_check()`: with each read of the job's status while it runs (stopping.py),
  an item status to end the run's unsent items with (the spend limit's), or None;
- `before_admission(run, route, items)`: a route's items still to admit;
- inside the admission loop, per chunk or per call: `before_acquire(budget)`
  (seconds to wait first, or None), `chunk_admitted(entries, waited_s)`,
  `capped(budget)` (a cap of the job's, not the deployment, refused it),
  `retry_admitted(entry, waited_s)`, `call_ended(...)` (the only per-request
  point), `before_wait()` (True: hand the batch back rather than wait) and
  `flush()` (with each settle of provider feedback);
- `before_store(session, job_id, answered, now)`: in the transaction that
  stores a chunk of answers, with the answered calls it stored (the spend hook
  bills them);
- `on_stop(run)`: the run sent its last call; run in reverse order (the
  last hook to start is the first to stop, as nested `with` blocks unwind),
  each one even where another raised.

A hook is made per run, so it keeps its own state and knows its job: the points
inside the loop take only what just happened. `Hooks` keeps, per point, the
bound methods of the hooks that override it, so a point no hook of the run
uses costs the loop one empty iteration and no call.
"""

from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from quotaflow.deployments.catalog import Route
from quotaflow.deployments.limits import Budget
from quotaflow.execution.admitted import Admitted
from quotaflow.providers.base import ProviderResponse
from quotaflow.providers.outcomes import Provenance
from quotaflow.results.leases import ClaimedItem, OnStored

if TYPE_CHECKING:  # batch.py carries the hooks: a run's type only, to avoid a cycle
    from quotaflow.execution.batch import BatchRun


class BatchHook:
    """A policy of batch runs; override only the points it needs (see the module)."""

    def before_claim(self) -> float | None:
        """Seconds after which the batch should run again instead of claiming now."""
        return None

    def claimed(self, run: "BatchRun", items: list[ClaimedItem]) -> list[ClaimedItem]:
        """The claimed items still to call; those left out must be `run.finish`ed."""
        return items

    def stop_check(self) -> str | None:
        """Asked with each read of the job's status while it runs: an item status to end
        the unsent items with, or None. A run with a check reads at once, on its own."""
        return None

    def before_admission(self, run: "BatchRun", route: Route,
                         items: list[ClaimedItem]) -> list[ClaimedItem]:
        """A route's items still to admit (the route as served: batch deployments
        included); those left out must be finished or handed on."""
        return items

    def before_acquire(self, budget: Budget) -> float | None:
        """Seconds to wait before asking the limiter for `budget`, or None: ask now."""
        return None

    def chunk_admitted(self, entries: Sequence[Admitted], waited_s: float) -> None:
        """The limiter admitted `entries` (one deployment) `waited_s` after the claim."""

    def retry_admitted(self, entry: Admitted, waited_s: float) -> None:
        """A retry was admitted `waited_s` after it asked."""

    def capped(self, budget: Budget) -> None:
        """A cap of the run's job (its tenant's, its own) refused its next request on
        `budget`: it waits for the cap, while the deployment may have room for others."""

    def call_ended(self, deployment: str, code: str, latency_s: float,
                   prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
        """A provider call ended (`code`: its status, or metrics.error_code). Runs once
        per request: keep it to a few plain operations."""

    def before_wait(self) -> bool:
        """True: hand the run's unstarted items back to the queue rather than wait."""
        return False

    def flush(self) -> None:
        """Write what the hook buffered; called as provider feedback is settled."""

    def before_store(self, session: Session, job_id: str,
                     answered: list[tuple[ProviderResponse, Provenance]],
                     now: datetime) -> None:
        """In the transaction storing a chunk: `answered`, the calls it newly stored."""

    def on_stop(self, run: "BatchRun") -> None:
        """The run sent its last call (its answers are stored next, whatever ended it)."""


_POINTS = ("before_claim", "claimed", "stop_check", "before_admission", "before_acquire",
           "chunk_admitted", "retry_admitted", "capped", "call_ended", "before_wait", "flush",
           "before_store", "on_stop")


class Hooks:
    """A run's hooks in order, and per point the bound methods of those that use it."""

    __slots__ = ("hooks", *_POINTS)

    before_claim: tuple[Callable[[], float | None], ...]
    claimed: tuple[Callable[["BatchRun", list[ClaimedItem]], list[ClaimedItem]], ...]
    stop_check: tuple[Callable[[], str | None], ...]
    before_admission: tuple[Callable[["BatchRun", Route, list[ClaimedItem]],
                                     list[ClaimedItem]], ...]
    before_acquire: tuple[Callable[[Budget], float | None], ...]
    chunk_admitted: tuple[Callable[[Sequence[Admitted], float], None], ...]
    retry_admitted: tuple[Callable[[Admitted, float], None], ...]
    capped: tuple[Callable[[Budget], None], ...]
    call_ended: tuple[Callable[..., None], ...]
    before_wait: tuple[Callable[[], bool], ...]
    flush: tuple[Callable[[], None], ...]
    before_store: tuple[OnStored, ...]
    on_stop: tuple[Callable[["BatchRun"], None], ...]

    def __init__(self, hooks: Sequence[BatchHook] = ()) -> None:
        self.hooks = tuple(hooks)
        for point in _POINTS:
            default = getattr(BatchHook, point)
            setattr(self, point, tuple(getattr(hook, point) for hook in self.hooks
                                       if getattr(type(hook), point) is not default))

    def come_back_in(self) -> float | None:
        """The first hook's seconds to come back in without claiming, else None."""
        for ask in self.before_claim:
            if (seconds := ask()) is not None:
                return seconds
        return None

    def to_call(self, run: "BatchRun", items: list[ClaimedItem]) -> list[ClaimedItem]:
        """The claimed items, through every `claimed` in order, till none are left."""
        for take in self.claimed:
            if not items:
                break
            items = take(run, items)
        return items

    def to_admit(self, run: "BatchRun", route: Route,
                 items: list[ClaimedItem]) -> list[ClaimedItem]:
        for take in self.before_admission:
            if not items:
                break
            items = take(run, route, items)
        return items

    def wait_first(self, budget: Budget) -> float | None:
        """Seconds to wait before the next acquire of `budget` (the first hook's), else None."""
        for ask in self.before_acquire:
            if (seconds := ask(budget)) is not None:
                return seconds
        return None

    def gives_way(self) -> bool:
        return any(ask() for ask in self.before_wait)

    def flush_all(self) -> None:
        for flush in self.flush:
            flush()

    @property
    def on_stored(self) -> OnStored | None:
        """What the result writer hands store_many to call in each chunk's transaction:
        None, where no hook stores anything beside the answers (no call per chunk then)."""
        return self.stored if self.before_store else None

    def stored(self, session: Session, job_id: str,
               answered: list[tuple[ProviderResponse, Provenance]], now: datetime) -> None:
        """Every `before_store`, in the storing transaction."""
        for store in self.before_store:
            store(session, job_id, answered, now)

    def stop(self, run: "BatchRun") -> None:
        """Every `on_stop`, last hook first; the first exception is raised after all ran."""
        error: BaseException | None = None
        for stop in reversed(self.on_stop):
            try:
                stop(run)
            except Exception as exc:
                error = error or exc
        if error is not None:
            raise error

    def __repr__(self) -> str:
        return f"Hooks({', '.join(type(hook).__name__ for hook in self.hooks)})"

    def __iter__(self) -> Iterator[BatchHook]:
        return iter(self.hooks)

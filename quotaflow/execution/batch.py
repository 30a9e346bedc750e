"""The state one batch run carries from claim to report, shared by the loop's parts."""

import time
from dataclasses import dataclass, field
from typing import Any

from quotaflow.deployments.limits import Cap
from quotaflow.dispatch.queues import BatchRef
from quotaflow.execution.feedback import Feedback
from quotaflow.execution.fencing import Fence
from quotaflow.execution.hooks import Hooks
from quotaflow.execution.retries import RetryPolicy
from quotaflow.execution.stopping import JobWatch
from quotaflow.execution.writer import ResultWriter
from quotaflow.providers.anthropic_answers import reshape
from quotaflow.providers.base import ProviderResponse
from quotaflow.providers.outcomes import Outcome, Provenance
from quotaflow.results.leases import ClaimedItem


@dataclass(frozen=True)
class BatchReport:
    """What one run of a batch did; retry_in is set when some items must be run later."""

    claimed: int
    succeeded: int
    failed: int
    retry_in: float | None = None


@dataclass
class BatchRun:
    """One run of a batch: its job, claim owner, endpoint, queue floor and retry policy;
    where its outcomes and provider feedback go; its policies' hooks; and when to run it
    again."""

    ref: BatchRef
    owner: str
    url: str
    floor: float
    policy: RetryPolicy
    writer: ResultWriter
    feedback: Feedback
    watch: JobWatch
    retry_in: float | None = field(default=None)
    # When the items were claimed: their admission wait counts from here (metrics).
    started: float = field(default_factory=time.monotonic)
    # The shape the job's answers are stored in: an answer in the other is made over.
    output_format: str = "openai"
    # The policies this run follows, in order (hooks.py; policies/ makes them).
    hooks: Hooks = field(default_factory=Hooks)
    # Whether it still holds its items' leases (fencing.py); None: not checked.
    fence: Fence | None = None
    # Its job's caps inside each deployment's budget (quotaflow/budget/caps.py).
    caps: tuple[Cap, ...] = ()
    # A hook gave the run's worker slot away (another tenant waits for one): every
    # route hands its unsent items back, or the slot stays held by the routes left.
    giving_way: bool = False

    def holds(self, item: ClaimedItem) -> bool:
        """The item's lease is still this run's: it may be sent. Asked before every call,
        so the common answer (the lease is surely held) costs a clock read, not the
        list and set of Fence.held."""
        fence = self.fence
        return fence is None or fence.sure() or item.line_no in fence.held([item.line_no])

    def finish(self, item: ClaimedItem, outcome: Outcome,
               provenance: Provenance | None = None) -> None:
        if isinstance(outcome, ProviderResponse) and outcome.answer_format != self.output_format:
            outcome = reshape(outcome, self.output_format)
        self.writer.add(item, outcome, provenance)

    @property
    def context(self) -> dict[str, Any]:
        """The `extra=` of this run's log lines: its job and its line range."""
        return {"job_id": self.ref.job_id,
                "batch": f"{self.ref.first_line}-{self.ref.last_line}"}

    def later(self, seconds: float) -> None:
        self.retry_in = seconds if self.retry_in is None else min(self.retry_in, seconds)

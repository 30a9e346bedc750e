"""The one place where the settings become a batch run's hooks (execution/hooks.py).

Each policy is a hook module beside this one. `Policies` decides once per executor
which can apply at all (a setting is off, no deployment has prices, no batch
deployment exists) and, per run, which apply to its job; a hook whose policy is off
for the run is not in its list, so it costs the run nothing.

The order is the order of the points' calls (`on_stop` the reverse): fair shares
first, so a run that gives way before claiming does nothing else, and their
bookkeeping brackets the others'; metrics last, so what they count is what the
others let through. To add a policy: a BatchHook subclass in a module here, and
a line in `Policies.hooks_for` saying when a run gets it (docs/architecture.md,
"Execution").
"""

from sqlalchemy.orm import Session, sessionmaker

from quotaflow.budget.fair_share import FairShare, NoFairShare
from quotaflow.config import Settings
from quotaflow.constants import QUEUE_BULK, QUEUE_REALTIME
from quotaflow.deployments.catalog import Deployments
from quotaflow.execution.facts import JobFacts
from quotaflow.execution.hooks import BatchHook, Hooks
from quotaflow.execution.policies.fair_share_hook import FairShareHook
from quotaflow.execution.policies.metrics_hook import MetricsHook
from quotaflow.execution.policies.offload_hook import OffloadHook
from quotaflow.execution.policies.reuse_hook import ReuseHook
from quotaflow.execution.policies.spend_hook import SpendHook


class Policies:
    """Which hooks a run gets: decided from the settings and deployments once, and from
    the job's facts per run."""

    def __init__(self, sessions: sessionmaker[Session], deployments: Deployments,
                 settings: Settings, fair: FairShare | None, provider_batches: bool,
                 metrics: bool = True) -> None:
        self.sessions = sessions
        self.deployments = deployments
        self.settings = settings
        # NoFairShare answers every ask with yes: no hook at all does the same for less.
        self.fair = None if fair is None or type(fair) is NoFairShare else fair
        self.prices = {name: d.prices for name, d in deployments.deployments.items()}
        # Calls cost something only where a deployment has prices (quotaflow/tenants/spend.py).
        self.spending = any(prices is not None for prices in self.prices.values())
        # The metrics tally only where its counters are read (a worker serving them):
        # elsewhere it is a per-request count nobody sees.
        self.metrics = metrics
        # Bulk lines go to provider batch deployments only where workers run the poll
        # loop (Celery); the embedded runner treats them as unavailable.
        self.offload = provider_batches and any(
            d.is_batch for d in deployments.deployments.values())

    def hooks_for(self, job: JobFacts) -> Hooks:
        """The run's hooks, in order, fresh for the run (they keep its state)."""
        hooks: list[BatchHook] = []
        if self.fair is not None and job.queue != QUEUE_REALTIME:
            hooks.append(FairShareHook(self.fair, job.tenant, job.weight))
        if self.spending:
            hooks.append(SpendHook(self.sessions, job.tenant, self.prices,
                                   self.settings.max_monthly_spend))
        if self.settings.dedup_across_jobs:
            hooks.append(ReuseHook(self.sessions, job.tenant))
        if self.offload and job.queue == QUEUE_BULK:
            hooks.append(OffloadHook(self.sessions, self.deployments))
        if self.metrics:
            hooks.append(MetricsHook(job.queue))
        return Hooks(hooks)

"""A process's quotaflow, wired in one place from its Settings.

The API, the workers, the reaper and `quotaflow run` all ask a Runtime for the
database sessions, the deployments, the limiter, the circuit breaker, the
dispatcher and the batch executor, instead of each assembling its own. Parts
are built on first use: a Celery worker makes its Runtime after the fork, so no
connection pool is shared across processes, and an API that never queues a job
never needs a broker.

How batches reach the workers is the one thing given from outside (a
`Transport`, workers/dispatch.py's CeleryDispatcher), since the domain does not
import Celery; `quotaflow run` keeps its batches in a CollectingDispatcher and
runs them itself.
"""

from collections.abc import Callable
from functools import cached_property

from sqlalchemy.orm import Session, sessionmaker

from quotaflow.budget.buckets import LocalLimiter, make_limiter
from quotaflow.budget.circuit import CircuitBreaker, LocalCircuitBreaker, make_breaker
from quotaflow.budget.fair_share import FairShare, make_fair_share
from quotaflow.budget.limiter import Limiter
from quotaflow.config import Settings
from quotaflow.db import session_factory
from quotaflow.deployments.catalog import Deployments
from quotaflow.dispatch.fair_waiting import MarkingDispatcher
from quotaflow.dispatch.queues import CollectingDispatcher, Dispatcher, PlacingDispatcher
from quotaflow.errors import ConfigError
from quotaflow.execution import BatchExecutor

# Makes the dispatcher that publishes batches on a broker, given its URL.
Transport = Callable[[str], Dispatcher]

# A closed circuit is read again after this long (quotaflow/budget/circuit.py): another
# worker's failures reach this one's routing at most this late.
CIRCUIT_CLOSED_FOR_S = 0.25


class Runtime:
    """The parts one process works with; `in_process` is `quotaflow run`: one process
    holds the whole budget (the in-process limiter and breaker are exact) and runs the
    batches it dispatches itself. `metrics`: whether its batch runs count for Prometheus,
    which only a process whose counters are served needs (a worker started with a
    metrics port: workers/metrics.py)."""

    def __init__(self, settings: Settings, transport: Transport | None = None,
                 *, in_process: bool = False, metrics: bool = True) -> None:
        self.settings = settings
        self._transport = transport
        self.in_process = in_process
        self.metrics = metrics

    @cached_property
    def sessions(self) -> sessionmaker[Session]:
        return session_factory(self.settings.database_url)

    @cached_property
    def deployments(self) -> Deployments:
        return self.settings.load_deployments()

    @cached_property
    def limiter(self) -> Limiter:
        return LocalLimiter() if self.in_process else make_limiter(self.settings.limiter_url)

    @cached_property
    def breaker(self) -> CircuitBreaker:
        if self.in_process:
            return LocalCircuitBreaker()
        return make_breaker(self.settings.limiter_url, CIRCUIT_CLOSED_FOR_S)

    @cached_property
    def dispatcher(self) -> Dispatcher:
        """Batches go where they are run: a local deployment's to its own queues, or, in
        process, to this process's own list (a CollectingDispatcher)."""
        if self.in_process:
            return CollectingDispatcher()
        if self._transport is None:
            raise ConfigError("this process was started without a way to queue batches")
        if not self.settings.broker_url:
            raise ConfigError("QUOTAFLOW_BROKER_URL is not set; jobs are queued on Redis, "
                              "e.g. QUOTAFLOW_BROKER_URL=redis://127.0.0.1:6379/0")
        placing = PlacingDispatcher(self._transport(self.settings.broker_url), self.sessions,
                                    self.deployments)
        if not self.settings.fair_share:
            return placing
        return MarkingDispatcher(placing, self.sessions, self.fair_share)

    @cached_property
    def fair_share(self) -> FairShare:
        """Tenants' shares of each budget (quotaflow/budget/fair_share.py); none in process."""
        return make_fair_share(None if self.in_process else self.settings.limiter_url,
                               self.settings.fair_share)

    @cached_property
    def executor(self) -> BatchExecutor:
        """Built once per process; `quotaflow run` waits for budget in place instead of
        handing batches back to a queue."""
        return BatchExecutor(self.sessions, self.deployments, self.limiter, self.settings,
                             breaker=self.breaker, defer=not self.in_process,
                             fair=self.fair_share, metrics=self.metrics)

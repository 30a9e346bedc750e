"""State that lives in Redis and PostgreSQL, read when Prometheus scrapes the API.

Bucket levels, circuits, queue depths, items by status and what calls cost (the
spend ledger) are the cluster's,
not any one process's: counted in every worker they would be counted once per
worker. So the API reads them at scrape time, once per scrape, and serves them
with the gauges below (api/metrics.py). Each source is read on its own: one
that is down leaves its gauges out and sets quotaflow_metrics_source_up{source}
to 0, and the rest are served.

Queue depth is the length of each Celery queue's list in the broker's Redis;
the oldest message is its list's last element (Celery LPUSHes and BRPOPs), and
its age is read from the `quotaflow_queued_at` header workers/dispatch.py puts
on every message (protocol 2 records no send time). A message without it
(queued by an older version) leaves the age out.
"""

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import orjson
import redis
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.budget.circuit import CircuitBreaker, CircuitState
from quotaflow.budget.limiter import Limiter
from quotaflow.config import Settings
from quotaflow.constants import QUEUES, local_queue
from quotaflow.deployments.catalog import Deployments
from quotaflow.models import Item, ItemStatus, Job, JobStatus
from quotaflow.tenants.spend import costs_by_tenant

log = logging.getLogger(__name__)

QUEUED_AT = "quotaflow_queued_at"
# quotaflow_circuit_state: 0 closed, 1 half-open (a probe free or in flight), 2 open.
CIRCUIT_VALUES = {CircuitState.CLOSED: 0, CircuitState.PROBE_FREE: 1,
                  CircuitState.PROBING: 1, CircuitState.OPEN: 2}
# Items are counted for the jobs still running: the finished ones' counts only grow, and
# counting them would make every scrape read the whole table.
UNFINISHED_JOBS = (JobStatus.VALIDATING, JobStatus.IN_PROGRESS, JobStatus.FINALIZING,
                   JobStatus.CANCELLING)


def _statuses(names: type) -> tuple[str, ...]:
    """A status class's statuses (its upper-case strings; not its groups of them)."""
    return tuple(v for k, v in vars(names).items() if k.isupper() and isinstance(v, str))


ITEM_STATUSES = _statuses(ItemStatus)
JOB_STATUSES = _statuses(JobStatus)


def _gauge(name: str, doc: str, labels: Iterable[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


class StateSources(Protocol):
    """What the gauges read: a process's Runtime has it all (quotaflow/runtime.py), and
    naming only this keeps the arrow pointing down, from the wiring to the gauges."""

    settings: Settings

    @property
    def deployments(self) -> Deployments: ...

    @property
    def limiter(self) -> Limiter: ...

    @property
    def breaker(self) -> CircuitBreaker: ...

    @property
    def sessions(self) -> sessionmaker[Session]: ...


class StateCollector(Collector):
    """Reads the cluster's state from Redis and PostgreSQL on every collect()."""

    def __init__(self, runtime: StateSources) -> None:
        self.runtime = runtime
        url = runtime.settings.broker_url
        self._broker = (redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
                        if url and url.startswith(("redis://", "rediss://")) else None)

    def collect(self) -> Iterator[Metric]:
        up = _gauge("quotaflow_metrics_source_up",
                    "1 when the source was read for this scrape, 0 when it was not",
                    ["source"])
        for source, read in (("limiter", self._budgets), ("breaker", self._circuits),
                             ("broker", self._queues), ("database", self._statuses)):
            try:
                families = list(read())
            except Exception as exc:  # a source that is down must not fail the others
                log.warning("metrics: %s unreadable (%s)", source, exc.__class__.__name__)
                up.add_metric([source], 0)
                continue
            up.add_metric([source], 1)
            yield from families
        yield up

    def _budgets(self) -> Iterator[GaugeMetricFamily]:
        families = {name: _gauge(f"quotaflow_budget_{name}", doc, ["deployment"]) for name, doc in (
            ("utilisation", "Used share of the fuller-used bucket, max(RPM use, TPM use), 0..1"),
            ("available_requests", "Requests left in the deployment's bucket now"),
            ("available_tokens", "Tokens left in the deployment's bucket now"),
            ("limit_requests_per_minute", "The deployment's RPM limit"),
            ("limit_tokens_per_minute", "The deployment's TPM limit"))}
        limiter = self.runtime.limiter
        for deployment in self.runtime.deployments.deployments.values():
            budget = deployment.budget
            levels = limiter.levels(budget)
            for name, value in (("utilisation", levels.utilisation(budget)),
                                ("available_requests", levels.requests),
                                ("available_tokens", levels.tokens),
                                ("limit_requests_per_minute", deployment.rpm),
                                ("limit_tokens_per_minute", deployment.tpm)):
                families[name].add_metric([deployment.name], value)
        yield from families.values()

    def _circuits(self) -> Iterator[GaugeMetricFamily]:
        family = _gauge("quotaflow_circuit_state",
                        "A deployment's circuit: 0 closed, 1 half-open, 2 open", ["deployment"])
        breaker = self.runtime.breaker
        for deployment in self.runtime.deployments.deployments.values():
            family.add_metric([deployment.name],
                              CIRCUIT_VALUES[breaker.state(deployment).state])
        yield family

    def queue_names(self) -> list[str]:
        """Every queue a batch may wait in: the priorities, and each local deployment's."""
        local = [local_queue(d.name, priority)
                 for d in self.runtime.deployments.deployments.values()
                 if d.provider == "local" for priority in QUEUES]
        return [*QUEUES, *local]

    def _queues(self) -> Iterator[GaugeMetricFamily]:
        if self._broker is None:
            return
        depth = _gauge("quotaflow_queue_depth", "Celery messages waiting in the queue",
                       ["queue"])
        age = _gauge("quotaflow_queue_oldest_age_seconds",
                     "Seconds the queue's oldest waiting message has waited (0 when empty)",
                     ["queue"])
        names = self.queue_names()
        with self._broker.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.llen(name)
                pipe.lindex(name, -1)
            replies = pipe.execute()
        now = time.time()
        for index, name in enumerate(names):
            length, oldest = replies[2 * index], replies[2 * index + 1]
            depth.add_metric([name], length)
            queued_at = queued_time(oldest) if oldest else now
            if queued_at is not None:
                age.add_metric([name], max(0.0, now - queued_at))
        yield depth
        yield age

    def _statuses(self) -> Iterator[Metric]:
        requests = _gauge("quotaflow_requests",
                          "Requests of unfinished jobs by status", ["status"])
        jobs = _gauge("quotaflow_jobs", "Jobs by status", ["status"])
        with self.runtime.sessions() as session:
            by_job = dict(session.execute(
                select(Job.status, func.count()).group_by(Job.status)).all())
            # The ids as values, not a join: the planner then knows how many items they
            # hold (an index-only scan for a few, a sequential one for most of the table).
            ids = list(session.scalars(select(Job.id).where(Job.status.in_(UNFINISHED_JOBS))))
            by_item = dict(session.execute(
                select(Item.status, func.count()).where(Item.job_id.in_(ids))
                .group_by(Item.status)).all()) if ids else {}
            costs = costs_by_tenant(session)
        _fill(requests, ITEM_STATUSES, by_item.get)
        _fill(jobs, JOB_STATUSES, by_job.get)
        yield requests
        yield jobs
        # A counter kept in PostgreSQL (the spend ledger), so it survives every restart
        # and is the same whichever API replica is scraped.
        cost = CounterMetricFamily(
            "quotaflow_cost", f"What calls cost at the deployments' prices, in "
            f"{self.runtime.deployments.currency}", labels=["deployment", "tenant"])
        for tenant, deployment, amount in costs:
            cost.add_metric([deployment, tenant], amount)
        yield cost


def _fill(family: GaugeMetricFamily, statuses: Iterable[str],
          count: Callable[[str], Any]) -> None:
    """Every known status, 0 where none: a series that vanishes reads as no data."""
    for status in statuses:
        family.add_metric([status], count(status) or 0)


def queued_time(raw: bytes) -> float | None:
    """The `quotaflow_queued_at` header of a message as the Redis transport stores it."""
    try:
        value = orjson.loads(raw).get("headers", {}).get(QUEUED_AT)
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return float(value) if isinstance(value, int | float) else None

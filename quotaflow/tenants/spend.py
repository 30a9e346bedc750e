"""What tenants spend, and the monthly limit that stops them.

Every stored answer is billed in the transaction that stores it, from the rows that
transaction actually inserted (a batch stored twice after a crash is billed once),
into the `spend` ledger: one row per job, deployment and month (UTC), adding up
requests, tokens and cost at the prices of that moment. A job's cost, a tenant's
month and the `quotaflow_cost_total` metric are sums over a few ledger rows, never a
scan of the results.

A tenant's limit (its own, or QUOTAFLOW_MAX_MONTHLY_SPEND) is enforced twice:
ingest refuses a batch whose estimated cost (its prompt tokens and every line's
max_tokens at the route's dearest prices, each line in its long-context tier and its
requested cache writes at their price) is more than what is left, and a running
batch whose tenant has reached the limit stops sending: within STOP_CHECK_S
(quotaflow/execution/stopping.py) every unsent line of the tenant's running jobs
ends `spend_limit_exceeded`. Calls already sent finish and are billed, so the month
can end above the limit by at most what was in flight. Deployments without prices
cost nothing quotaflow can count and never stop a job.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from quotaflow import store
from quotaflow.config import Settings
from quotaflow.deployments.catalog import Deployments
from quotaflow.deployments.pricing import CostRange, Prices, Tallied, money
from quotaflow.errors import SpendLimitExceeded
from quotaflow.models import Item, ItemStatus, Job, JobStatus, Spend, Tenant, utcnow
from quotaflow.store.interface import Store
from quotaflow.tenants import quotas

STOP_REASON = "spend_limit_exceeded"
SPEND = Spend.__table__
_ADDED = ("requests", "prompt_tokens", "cached_tokens", "completion_tokens")


def month_of(moment: datetime) -> str:
    return moment.strftime("%Y-%m")


@dataclass(frozen=True, slots=True)
class Charge:
    """One answered call's usage, on the deployment that answered it (cache reads and
    writes are part of prompt_tokens, 1-hour writes part of the writes)."""

    deployment: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    cache_write_1h_tokens: int = 0


class Usage(Protocol):
    """An answered call's usage as its provider reported it (a ProviderResponse)."""

    @property
    def prompt_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def cached_tokens(self) -> int: ...
    @property
    def cache_write_tokens(self) -> int: ...
    @property
    def cache_write_1h_tokens(self) -> int: ...


class Answerer(Protocol):
    """Which deployment answered a call (a Provenance)."""

    @property
    def deployment(self) -> str: ...


@dataclass(frozen=True)
class Billing:
    """Whose a batch's calls are and what they cost: built once per batch run."""

    tenant: str
    prices: Mapping[str, Prices | None]  # by deployment name

    @classmethod
    def for_job(cls, tenant: str, deployments: Deployments) -> "Billing":
        return cls(tenant, {name: d.prices for name, d in deployments.deployments.items()})

    def stored(self, session: Session, job_id: str,
               answered: Sequence[tuple[Usage, Answerer]], now: datetime) -> None:
        """Bill the answered calls whose results the caller's transaction just stored
        (leases.store_many's `on_stored`)."""
        self.record(session, job_id, [
            Charge(call.deployment, usage.prompt_tokens, usage.completion_tokens,
                   usage.cached_tokens, usage.cache_write_tokens, usage.cache_write_1h_tokens)
            for usage, call in answered], now)

    def record(self, session: Session, job_id: str, charges: Iterable[Charge],
               now: datetime) -> None:
        """Add the charges to the ledger, one row per deployment, in the caller's
        transaction (the one that stores their results)."""
        rows: dict[str, dict[str, Any]] = {}
        for charge in charges:
            row = rows.get(charge.deployment)
            if row is None:
                prices = self.prices.get(charge.deployment)
                row = rows[charge.deployment] = {
                    "job_id": job_id, "deployment": charge.deployment, "month": month_of(now),
                    "tenant": self.tenant, "requests": 0, "prompt_tokens": 0,
                    "cached_tokens": 0, "completion_tokens": 0,
                    "cost": None if prices is None else 0.0,
                    "currency": None if prices is None else prices.currency, "_prices": prices}
            row["requests"] += 1
            row["prompt_tokens"] += charge.prompt_tokens
            row["cached_tokens"] += charge.cached_tokens
            row["completion_tokens"] += charge.completion_tokens
            prices = row["_prices"]
            if prices is not None:
                row["cost"] += prices.cost(charge.prompt_tokens, charge.completion_tokens,
                                           charge.cached_tokens, charge.cache_write_tokens,
                                           charge.cache_write_1h_tokens)
        if rows:
            for row in rows.values():
                del row["_prices"]
            session.execute(_upsert(session), list(rows.values()))


_UPSERTS: dict[Store, Any] = {}


def _upsert(session: Session) -> Any:
    """The ledger's add-to statement, built once per store (it runs with every chunk)."""
    kind = store.of(session)
    statement = _UPSERTS.get(kind)
    if statement is None:
        statement = _UPSERTS[kind] = kind.insert_adding(
            SPEND, ("job_id", "deployment", "month"), _ADDED, keep_null=("cost",),
            keep=("currency",))
    return statement


def month_spent(session: Session, tenant: str, month: str | None = None) -> float:
    """What the tenant's calls cost in the month (this one by default)."""
    return float(session.scalar(
        select(func.coalesce(func.sum(SPEND.c.cost), 0))
        .where(SPEND.c.tenant == tenant, SPEND.c.month == (month or month_of(utcnow())))) or 0)


def spend_limit(session: Session, settings: Settings, tenant: str) -> float | None:
    """The tenant's monthly limit: its own, else the settings' default, else None."""
    own = session.scalar(select(Tenant.max_monthly_spend).where(Tenant.name == tenant))
    return float(own) if own is not None else settings.max_monthly_spend


@dataclass(frozen=True)
class SpendRoom:
    """A tenant's month: its limit (None: none), what it spent, and what is left."""

    limit: float | None
    spent: float

    @property
    def left(self) -> float | None:
        return None if self.limit is None else max(0.0, self.limit - self.spent)


def spend_room(session: Session, settings: Settings, tenant: str) -> SpendRoom:
    return SpendRoom(spend_limit(session, settings, tenant), month_spent(session, tenant))


def estimate(deployments: Deployments,
             routes: Iterable[tuple[str, Tallied]]) -> tuple[CostRange | None, bool]:
    """The cost range of (route, its requests' tokens) groups, and whether every group's
    cost is known (a route to an unpriced deployment's is not)."""
    total: CostRange | None = None
    complete = True
    for route, tally in routes:
        part = deployments.route_cost(route, tally)
        if part is None:
            complete = False
            continue
        total = part if total is None else total + part
    return total, complete


def admit(session: Session, settings: Settings, tenant: str, cost: CostRange | None) -> None:
    """Refuse a batch that may cost more than the tenant has left this month; run inside
    the transaction that creates it, under the tenant's lock (quotas.lock_tenant), which
    a tenant without a limit does not take."""
    if cost is None or (limit := spend_limit(session, settings, tenant)) is None:
        return
    quotas.lock_tenant(session, tenant)
    room = SpendRoom(limit, month_spent(session, tenant))
    if room.spent >= limit or cost.high > limit - room.spent:
        unit = cost.currency
        raise SpendLimitExceeded(
            f"spend limit reached for tenant {tenant!r}: this batch may cost up to "
            f"{money(cost.high, unit)} (at least {money(cost.low, unit)}), "
            f"{money(room.spent, unit)} of this month's limit of {money(room.limit, unit)} "
            f"is spent, {money(room.left, unit)} is left. Lower the lines' max_tokens, split "
            f"the file, wait for next month, or raise the limit (QUOTAFLOW_MAX_MONTHLY_SPEND, "
            f"or `quotaflow keys create --tenant {tenant} --max-spend N`)")


def limit_reached(sessions: sessionmaker[Session], tenant: str,
                  default_limit: float | None) -> bool:
    """Whether the tenant has spent its monthly limit (its own, else `default_limit`);
    if so, stop its running jobs. The limit and the month are read in one statement."""
    own = select(Tenant.max_monthly_spend).where(Tenant.name == tenant).scalar_subquery()
    month = (select(func.coalesce(func.sum(SPEND.c.cost), 0))
             .where(SPEND.c.tenant == tenant, SPEND.c.month == month_of(utcnow()))
             .scalar_subquery())
    with sessions() as session:
        limit, spent = session.execute(select(own, month)).one()
    limit = float(limit) if limit is not None else default_limit
    if limit is None or float(spent or 0) < limit:
        return False
    stop_tenant(sessions, tenant)
    return True


def stop_tenant(sessions: sessionmaker[Session], tenant: str) -> list[str]:
    """Mark the tenant's running jobs stopped and end their unsent, unclaimed lines;
    claimed ones are ended by their batches (execution/stopping.py)."""
    with sessions.begin() as session:
        stopped = list(session.scalars(
            update(Job).where(Job.tenant == tenant, Job.status == JobStatus.IN_PROGRESS,
                              Job.stop_reason.is_(None))
            .values(stop_reason=STOP_REASON).returning(Job.id)))
        if stopped:
            session.execute(update(Item)
                            .where(Item.job_id.in_(stopped), Item.is_open,
                                   Item.status.in_((ItemStatus.PENDING, ItemStatus.WAITING)))
                            .values(status=ItemStatus.SPEND_LIMITED, lease_owner=None,
                                    lease_expires_at=None))
    return stopped


def job_cost(session: Session | None, job_id: str) -> dict[str, Any]:
    """The job's cost so far, per deployment and in total, from the ledger. A deployment
    without prices costs None and makes `complete` false: the total leaves it out.
    No session: a job just made, which has cost nothing yet."""
    if session is None:
        return {"currency": None, "total": 0.0, "complete": True, "by_deployment": {}}
    return job_costs(session, [job_id])[job_id]


def job_costs(session: Session, job_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """job_cost of each job, in one statement (a page of a list, a round of reads)."""
    rows: dict[str, list[Any]] = {job: [] for job in job_ids}
    for job, *row in session.execute(
            select(SPEND.c.job_id, SPEND.c.deployment, func.sum(SPEND.c.cost),
                   func.count(SPEND.c.cost), func.count(), func.max(SPEND.c.currency))
            .where(SPEND.c.job_id.in_(list(rows)))
            .group_by(SPEND.c.job_id, SPEND.c.deployment)):
        rows[job].append(row)
    return {job: _cost(found) for job, found in rows.items()}


def _cost(rows: Sequence[Sequence[Any]]) -> dict[str, Any]:
    by_deployment = {name: (None if priced < months else round(float(cost), 9))
                     for name, cost, priced, months, _ in rows}
    known = [cost for cost in by_deployment.values() if cost is not None]
    currency = next((unit for *_, unit in rows if unit), None)
    return {"currency": currency, "total": round(sum(known), 9),
            "complete": len(known) == len(by_deployment), "by_deployment": by_deployment}


def costs_by_tenant(session: Session) -> Sequence[tuple[str, str, float]]:
    """(tenant, deployment, cost) over all months: the quotaflow_cost_total counter."""
    return [(tenant, deployment, float(cost)) for tenant, deployment, cost in session.execute(
        select(SPEND.c.tenant, SPEND.c.deployment, func.sum(SPEND.c.cost))
        .where(SPEND.c.cost.is_not(None)).group_by(SPEND.c.tenant, SPEND.c.deployment))]

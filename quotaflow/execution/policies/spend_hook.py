"""The spend switch as a hook (quotaflow/tenants/spend.py): a run's answered calls are billed in
the transaction that stores them, and its stop check also adds up the tenant's month.

Only where some deployment has prices: otherwise calls cost nothing quotaflow can
count, nothing is billed and no limit is looked at (the run gets no such hook).
"""

from collections.abc import Mapping, Sequence
from datetime import datetime

from sqlalchemy.orm import Session

from quotaflow.deployments.pricing import Prices
from quotaflow.execution.batch import BatchRun
from quotaflow.execution.hooks import BatchHook
from quotaflow.results.leases import ClaimedItem
from quotaflow.tenants.spend import Billing, Charge


class SpendHook(BatchHook):
    def __init__(self, tenant: str, prices: Mapping[str, Prices | None],
                 default_limit: float | None) -> None:
        self.billing = Billing(tenant, prices)
        self.default_limit = default_limit  # QUOTAFLOW_MAX_MONTHLY_SPEND

    def claimed(self, run: BatchRun, items: list[ClaimedItem]) -> list[ClaimedItem]:
        run.watch.count_spend(self.default_limit)
        return items

    def before_store(self, session: Session, job_id: str, charges: Sequence[Charge],
                     now: datetime) -> None:
        self.billing.record(session, job_id, charges, now)

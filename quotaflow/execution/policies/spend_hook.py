"""The spend switch as a hook (quotaflow/tenants/spend.py): a run's answered calls are billed in
the transaction that stores them, and each read of its job's status also adds up the
tenant's month, stopping the tenant's jobs once its limit is reached.

Only where some deployment has prices: otherwise calls cost nothing quotaflow can
count, nothing is billed and no limit is looked at (the run gets no such hook).
"""

from collections.abc import Mapping
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from quotaflow.deployments.pricing import Prices
from quotaflow.execution.hooks import BatchHook
from quotaflow.models import ItemStatus
from quotaflow.providers.base import ProviderResponse
from quotaflow.providers.outcomes import Provenance
from quotaflow.tenants import spend
from quotaflow.tenants.spend import Billing


class SpendHook(BatchHook):
    def __init__(self, sessions: sessionmaker[Session], tenant: str,
                 prices: Mapping[str, Prices | None], default_limit: float | None) -> None:
        self.sessions = sessions
        self.tenant = tenant
        self.billing = Billing(tenant, prices)
        self.default_limit = default_limit  # QUOTAFLOW_MAX_MONTHLY_SPEND

    def stop_check(self) -> str | None:
        """The tenant's limit (its own, else the default) reached: its jobs stop."""
        if spend.limit_reached(self.sessions, self.tenant, self.default_limit):
            return ItemStatus.SPEND_LIMITED
        return None

    def before_store(self, session: Session, job_id: str,
                     answered: list[tuple[ProviderResponse, Provenance]],
                     now: datetime) -> None:
        self.billing.stored(session, job_id, answered, now)

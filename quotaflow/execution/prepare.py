"""An item made ready for one deployment: its body as sent there and what it costs."""

from quotaflow.deployments import Deployment, Deployments
from quotaflow.errors import ConfigError, RequestTooLarge
from quotaflow.execution.admitted import Admitted
from quotaflow.execution.loops import ProviderPool
from quotaflow.leases import ClaimedItem
from quotaflow.outcomes import Failure, FailureCode
from quotaflow.ratelimit import Budget
from quotaflow.tokens import admission_tokens


class Preparer:
    """Prepares items for deployments, refusing what could never go there."""

    def __init__(self, deployments: Deployments, providers: ProviderPool) -> None:
        self.providers = providers
        self.budgets = {d.name: Budget.of(d) for d in deployments.deployments.values()}

    def prepare(self, url: str, deployment: Deployment, item: ClaimedItem) -> Admitted | Failure:
        """The item as `deployment` would receive it, or why it cannot go there."""
        try:
            provider = self.providers.get(deployment)
        except ConfigError as exc:  # e.g. the key's environment variable is not set
            return Failure(FailureCode.CONFIGURATION_ERROR, str(exc))
        body = {**item.body, "model": deployment.model}
        cost = admission_tokens(url, body, deployment.default_max_tokens)
        budget = self.budgets[deployment.name]
        try:
            budget.check_fits(cost)
        except RequestTooLarge as exc:
            return Failure(FailureCode.REQUEST_TOO_LARGE, str(exc))
        return Admitted(item, deployment, provider, budget, body, cost)

"""An item made ready for one deployment: its body as sent there and what it costs.

A line goes to a deployment of its own family as written (only `model` set), and is
translated for the other family (quotaflow/providers/translate/); a field that has no
equivalent there fails the line here, naming it.
"""

from quotaflow.budget.tokens import admission_tokens, max_output_tokens, prompt_tokens
from quotaflow.deployments.catalog import Deployments
from quotaflow.deployments.deployment import Deployment
from quotaflow.deployments.limits import Budget, Cap
from quotaflow.errors import ConfigError, RequestTooLarge, Untranslatable
from quotaflow.execution.admitted import Admitted
from quotaflow.execution.loops import ProviderPool
from quotaflow.providers.capabilities import unserved
from quotaflow.providers.outcomes import Failure, FailureCode
from quotaflow.providers.translate.body import request_body
from quotaflow.results.leases import ClaimedItem


class Preparer:
    """Prepares items for deployments, refusing what could never go there."""

    def __init__(self, deployments: Deployments, providers: ProviderPool) -> None:
        self.providers = providers
        self.budgets = {d.name: d.budget for d in deployments.deployments.values()}
        # (deployment, caps) -> its budget under those caps, made once.
        self._capped: dict[tuple[str, tuple[Cap, ...]], Budget] = {}

    def prepare(self, url: str, deployment: Deployment, item: ClaimedItem,
                caps: tuple[Cap, ...] = ()) -> Admitted | Failure:
        """The item as `deployment` would receive it, or why it cannot go there; its
        budget carries the job's `caps` (its tenant's and its own)."""
        if (refused := unserved(deployment, url)) is not None:  # providers/capabilities.py
            return refused
        try:
            provider = self.providers.get(deployment)
        except ConfigError as exc:  # e.g. the key's environment variable is not set
            return Failure(FailureCode.CONFIGURATION_ERROR, str(exc))
        budget = self.budgets[deployment.name]
        if caps:
            budget = self._capped.get((deployment.name, caps)) or self._capped.setdefault(
                (deployment.name, caps), budget.with_caps(caps))
        try:
            body = request_body(item.body, deployment)
        except Untranslatable as exc:
            return Failure(FailureCode.INVALID_REQUEST,
                           f"deployment {deployment.name!r}: {exc}")
        input_cost = 0
        if budget.split:  # max_tokens against OTPM, the prompt against ITPM
            cost = max_output_tokens(item.body, deployment.default_max_tokens)
            input_cost = prompt_tokens(url, item.body)  # images by their own rule
        else:
            cost = admission_tokens(url, item.body, deployment.default_max_tokens)
        try:
            budget.check_fits(cost, input_cost)
        except RequestTooLarge as exc:
            return Failure(FailureCode.REQUEST_TOO_LARGE, str(exc))
        return Admitted(item, deployment, provider, budget, body, cost, input_cost=input_cost)


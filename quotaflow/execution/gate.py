"""The one way a request is let through to a deployment: route, prepare, acquire.

A first admission (admission.py, a chunk at a time) and the re-admission of a retry
(attempts.py, one item) take the same three steps through a Gate: `choose` asks the
router for a deployment of the route, `prepare` makes the items ready for it (its body,
its cost), and `acquire` asks the limiter for their budget at the run's queue floor (a
split budget's input tokens too) and pays the admitted ones. What a caller does when
the way is shut (wait, hand the items back, fail a retry) stays its own.
"""

from collections.abc import Collection

from quotaflow.budget.limiter import Admission, Limiter
from quotaflow.budget.routing import Choice, Router
from quotaflow.deployments.catalog import Route
from quotaflow.deployments.deployment import Deployment
from quotaflow.execution.admitted import Admitted
from quotaflow.execution.batch import BatchRun
from quotaflow.execution.prepare import Preparer
from quotaflow.providers.outcomes import Failure
from quotaflow.results.leases import ClaimedItem


class Gate:
    """Routes, prepares and admits a run's items; ServiceUnavailable where the limiter's
    store is away (from `choose` or `acquire`)."""

    def __init__(self, router: Router, limiter: Limiter, preparer: Preparer) -> None:
        self.router = router
        self.limiter = limiter
        self.preparer = preparer

    def choose(self, route: Route, exclude: Collection[str] = ()) -> Choice:
        """The route's deployment for the next requests (none: a wait), `exclude` left out."""
        return self.router.choose(route, exclude=exclude)

    def prepare(self, run: BatchRun, deployment: Deployment, items: list[ClaimedItem]
                ) -> tuple[list[Admitted], list[tuple[ClaimedItem, Failure]]]:
        """The items made ready for `deployment` (their budget carrying the run's caps),
        in order, and those that can never go there, with why."""
        asked: list[Admitted] = []
        refused: list[tuple[ClaimedItem, Failure]] = []
        for item in items:
            prepared = self.preparer.prepare(run.url, deployment, item, run.caps)
            if isinstance(prepared, Failure):
                refused.append((item, prepared))
            else:
                asked.append(prepared)
        return asked, refused

    def acquire(self, run: BatchRun, asked: list[Admitted]) -> Admission:
        """The limiter's answer for `asked` (one deployment's, in order): the longest
        head that fits is admitted, and paid for."""
        budget = asked[0].budget
        admission = self.limiter.acquire(
            budget, [a.cost for a in asked], run.floor,
            [a.input_cost for a in asked] if budget.split else ())
        for entry in asked[:admission.admitted]:
            entry.paid(admission)
        return admission

"""Which route a claimed item takes, narrowed to what can serve it now; the items no
deployment of it can take fail here, naming why, before any budget is asked for.
"""

from quotaflow.deployments.catalog import Deployments, Route
from quotaflow.execution.batch import BatchRun
from quotaflow.providers.capabilities import serving_route, unserved_message
from quotaflow.providers.outcomes import Failure, FailureCode
from quotaflow.results.leases import ClaimedItem


def route_name(deployments: Deployments, item: ClaimedItem) -> str | None:
    """The route ingest stored with the item; one stored before routes were (migration
    0008) is routed by its model."""
    if item.route is not None:
        return item.route
    return deployments.route_name_for(item.body.get("model"))


def serving(run: BatchRun, deployments: Deployments, name: str | None,
            items: list[ClaimedItem]) -> Route | None:
    """The named route's deployments that serve the job's endpoint
    (quotaflow/providers/capabilities.py); None, with the items failed, where there are none."""
    route = deployments.route_named(name)
    if route is None:  # the deployments file changed since the job was made
        for item in items:
            run.finish(item, Failure(
                FailureCode.NO_DEPLOYMENT,
                f"no deployment serves model {item.body.get('model')!r} (route {name!r} "
                "is no longer in the deployments file)"))
        return None
    served = serving_route(route, deployments, run.url)
    if served is None:
        failure = Failure(FailureCode.UNSUPPORTED_ENDPOINT, unserved_message(
            (deployments.deployments[n] for n in route.names), run.url))
        for item in items:
            run.finish(item, failure)
    return served


def realtime(run: BatchRun, deployments: Deployments, route: Route, name: str | None,
             items: list[ClaimedItem]) -> Route | None:
    """The route without its provider batch deployments, which only take what the
    offload hook queued for them (policies/offload_hook.py); None, with the items failed,
    where nothing else is left."""
    if not any(deployments.deployments[n].is_batch for n in route.names):
        return route
    left = route.realtime(deployments)
    if left is None:
        for item in items:
            run.finish(item, Failure(
                FailureCode.NO_DEPLOYMENT,
                f"route {name!r} names only provider batch deployments, which take "
                "bulk jobs' lines only (README, \"Provider batch APIs\"); submit on "
                "the bulk queue or add a realtime fallback"))
    return left

"""Which endpoints each kind of deployment serves: the one table (docs/deployments/index.md).

A line sent where its endpoint is not served would cost a call and a provider error at
best, or a wrong answer; instead its route is narrowed to the deployments that serve
the job's endpoint (execution/executor.py), and a line none of them serves fails with
`unsupported_endpoint`, naming the endpoint and the deployments, before any call.
"""

from collections.abc import Iterable
from typing import Final

from quotaflow.constants import (
    ENDPOINT_CHAT,
    ENDPOINT_COMPLETIONS,
    ENDPOINT_EMBEDDINGS,
    ENDPOINTS,
)
from quotaflow.deployments.catalog import Deployments, Route
from quotaflow.deployments.deployment import Deployment
from quotaflow.providers.outcomes import Failure, FailureCode

_ALL = frozenset(ENDPOINTS)
SERVES: Final[dict[str, frozenset[str]]] = {
    "openai": _ALL,
    "openai-batch": _ALL,
    "mock": _ALL,
    "local": frozenset({ENDPOINT_CHAT, ENDPOINT_COMPLETIONS, ENDPOINT_EMBEDDINGS}),
    "anthropic": frozenset({ENDPOINT_CHAT}),
    "anthropic-batch": frozenset({ENDPOINT_CHAT}),
    "gemini": frozenset({ENDPOINT_CHAT}),
    "vertex": frozenset({ENDPOINT_CHAT}),
    "bedrock": frozenset({ENDPOINT_CHAT}),
    # Azure OpenAI's deployment-name path has no /responses or /moderations of a deployment.
    "azure": frozenset({ENDPOINT_CHAT, ENDPOINT_COMPLETIONS, ENDPOINT_EMBEDDINGS}),
    # Azure OpenAI's Batch API: chat completions (its batch files' one endpoint here).
    "azure-batch": frozenset({ENDPOINT_CHAT}),
}


def serves(deployment: Deployment, url: str) -> bool:
    """Whether the deployment's kind answers requests of that endpoint."""
    return url in SERVES.get(deployment.provider, ())


def unserved_message(deployments: Iterable[Deployment], url: str) -> str:
    """Why a line of `url` cannot go to these deployments, naming each with its kind."""
    named = [f"{d.name!r} (provider {d.provider})" for d in deployments]
    which = (f"deployment {named[0]} does not" if len(named) == 1
             else f"deployments {', '.join(named)} do not")
    return (f"{which} serve {url}; route this model to a deployment that does "
            "(docs/deployments/index.md, \"Provider kinds\")")


def unserved(deployment: Deployment, url: str) -> Failure | None:
    """The line's failure where the deployment cannot serve its endpoint, else None."""
    if serves(deployment, url):
        return None
    return Failure(FailureCode.UNSUPPORTED_ENDPOINT, unserved_message([deployment], url))


def serving_route(route: Route, deployments: Deployments, url: str) -> Route | None:
    """The route narrowed to the deployments that serve `url` (the route itself where all
    do): the rest of its group, else its fallbacks; None where none serves it."""
    table = deployments.deployments
    if all(serves(table[name], url) for name in route.names):
        return route
    group = [n for n in route.deployments if serves(table[n], url)]
    fallback = [n for n in route.fallback if serves(table[n], url)]
    if not group:
        group, fallback = fallback[:1], fallback[1:]
    return Route(deployments=group, fallback=fallback) if group else None

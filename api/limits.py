"""Each deployment's limits and live usage: every tenant's, so operator keys only."""

from typing import Any

from fastapi import APIRouter, Depends

from api.deps import DeploymentsDep, LimiterDep, operator
from api.errors import responses
from api.schemas.limits import DeploymentLimits, LimitsList
from quotaflow.budget.limiter import describe
from quotaflow.errors import DeploymentNotFound

router = APIRouter(tags=["limits"], dependencies=[Depends(operator)])


@router.get("/limits", response_model=LimitsList, response_model_exclude_unset=True,
            responses=responses(401, 403))
def limits(deployments: DeploymentsDep, limiter: LimiterDep) -> dict[str, Any]:
    """Every deployment's limits, current bucket levels and utilisation (operator keys:
    the usage is every tenant's)."""
    data = [describe(d, limiter) for d in deployments.deployments.values()]
    return {"object": "list", "data": data}


@router.get("/limits/{name}", response_model=DeploymentLimits,
            response_model_exclude_unset=True, responses=responses(401, 403, 404))
def deployment_limits(name: str, deployments: DeploymentsDep,
                      limiter: LimiterDep) -> dict[str, Any]:
    if name not in deployments.deployments:
        raise DeploymentNotFound(f"no deployment named {name!r}; known: "
                                 f"{', '.join(sorted(deployments.deployments))}")
    return describe(deployments.deployments[name], limiter)

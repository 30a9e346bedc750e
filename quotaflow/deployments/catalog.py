"""The deployments file: where a model can be called, and which models go where.

A deployment (quotaflow/deployments/deployment.py) is one provider endpoint + model + key with its
own limits; a route sends a model's requests to a group of deployments (and a
fallback). The file is TOML (docs/deployments/index.md); without one, quotaflow runs
on the built-in simulated mock provider.
"""

import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, model_validator

from quotaflow.constants import MOCK_PROVIDER
from quotaflow.deployments.deployment import (  # noqa: F401  (re-exported: where callers look for them)
    ANTHROPIC_VERSION,
    BATCH_KINDS,
    BATCH_LIMITS,
    Deployment,
    LocalDtype,
    LocalEngine,
    ProviderKind,
)
from quotaflow.deployments.pricing import CostRange, Tallied, cost_range
from quotaflow.errors import ConfigError


class Route(BaseModel):
    """Where a model's requests may go: a group, and an ordered fallback used only when
    every deployment of the group is unavailable (cooling down or circuit open)."""

    deployments: list[str] = Field(min_length=1)
    fallback: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        """A route may be written as one deployment name or a list of them."""
        if isinstance(value, str):
            return {"deployments": [value]}
        if isinstance(value, list):
            return {"deployments": value}
        return value

    @property
    def names(self) -> list[str]:
        return [*self.deployments, *self.fallback]

    def batch_deployment(self, deployments: "Deployments") -> "Deployment | None":
        """The first batch deployment of the group: where a bulk job's lines go."""
        for name in self.deployments:
            if deployments.deployments[name].is_batch:
                return deployments.deployments[name]
        return None

    def realtime(self, deployments: "Deployments") -> "Route | None":
        """The route without its batch deployments, which other jobs (and lines falling back
        from a provider batch) skip as unavailable: the rest of the group, else the
        fallbacks; None where only batch deployments are left."""
        def live(names: list[str]) -> list[str]:
            return [n for n in names if not deployments.deployments[n].is_batch]
        group, fallback = live(self.deployments), live(self.fallback)
        if not group:
            group, fallback = fallback[:1], fallback[1:]
        return Route(deployments=group, fallback=fallback) if group else None


class Deployments(BaseModel):
    """All deployments and the routes from a request's model to them."""

    deployments: dict[str, Deployment]
    routes: dict[str, Route]

    @model_validator(mode="after")
    def _check(self) -> "Deployments":
        for model, route in self.routes.items():
            for target in route.names:
                if target not in self.deployments:
                    raise ValueError(f"route {model!r} names unknown deployment {target!r}")
        shared: dict[str, Deployment] = {}
        for deployment in self.deployments.values():
            if deployment.quota is None:
                continue
            first = shared.setdefault(deployment.quota, deployment)
            limits = ("rpm", "tpm", "itpm", "otpm", "burst_seconds")
            if any(getattr(first, n) != getattr(deployment, n) for n in limits):
                raise ValueError(
                    f"deployments {first.name!r} and {deployment.name!r} share quota "
                    f"{deployment.quota!r} but differ in rpm/tpm/itpm/otpm/burst_seconds; a shared "
                    "quota has one set of limits")
        currencies = {d.prices.currency for d in self.deployments.values() if d.prices}
        if len(currencies) > 1:
            # A tenant's spend limit is one number: its deployments must agree on the unit.
            raise ValueError(f"priced deployments use several currencies ({sorted(currencies)});"
                             " give every deployment's prices in one currency")
        for model, route in self.routes.items():
            local = [n for n in route.names if self.deployments[n].provider == "local"]
            if len(local) > 1:
                # Placement (quotaflow/dispatch/queues.py) sends a request to the queue of the
                # one local deployment its route names; two would need two queues.
                raise ValueError(
                    f"route {model!r} names local deployments {local}; a route may name at "
                    "most one (serve one model from several GPUs by starting one "
                    "`quotaflow worker --deployment NAME` per GPU)")
        return self

    def local_deployment_for(self, route_name: str | None) -> Deployment | None:
        """The local deployment a route's requests may run on, if it names one."""
        route = self.route_named(route_name)
        for name in route.names if route else ():
            if self.deployments[name].provider == "local":
                return self.deployments[name]
        return None

    @property
    def currency(self) -> str:
        """The one currency of the deployments' prices (USD where none has prices)."""
        return next((d.prices.currency for d in self.deployments.values() if d.prices), "USD")

    def route_cost(self, route_name: str | None, tally: Tallied) -> CostRange | None:
        """What requests of that route may cost wherever it sends them; None: unknown."""
        route = self.route_named(route_name)
        if route is None:
            return None
        return cost_range((self.deployments[n].prices for n in route.names), tally)

    def route_price_marks(self, route_name: str | None) -> tuple[tuple[int, ...], bool]:
        """What a cost estimate of the route's requests must tell apart: the long-context
        thresholds of its deployments, and whether a request asking for cache writes may
        cost more than its input price at one of them."""
        route = self.route_named(route_name)
        priced = [p for n in (route.names if route else ())
                  if (p := self.deployments[n].prices) is not None]
        thresholds = tuple(sorted({p.long_context_above for p in priced
                                   if p.long_context is not None}))
        return thresholds, any(p.writes_priced for p in priced)

    def route_max_tokens(self, route_name: str | None) -> int:
        """The completion ceiling of a request that sets none: the route's largest default."""
        route = self.route_named(route_name)
        return max((self.deployments[n].default_max_tokens for n in route.names), default=1024) \
            if route else 1024

    @property
    def has_local(self) -> bool:
        return any(d.provider == "local" for d in self.deployments.values())

    def route_for(self, model: str | None) -> Route | None:
        """A model's route: an explicit one, every deployment of that model, or '*'."""
        return self.route_named(self.route_name_for(model))

    def route_name_for(self, model: str | None) -> str | None:
        """The name of a model's route, decided once per request, at ingest, and stored
        with it: the model itself where a route or a deployment names it, else "*"
        where the file has that route, else None (nothing serves the model)."""
        if model is not None and (model in self.routes or any(
                d.serves(model) for d in self.deployments.values())):
            return model
        return "*" if "*" in self.routes else None

    def route_named(self, name: str | None) -> Route | None:
        """The route of that name: an explicit one, or every deployment serving that model
        (its own, or one of its LoRA adapters)."""
        if name is None:
            return None
        if name in self.routes:
            return self.routes[name]
        same = [d.name for d in self.deployments.values() if d.serves(name)]
        return Route(deployments=same) if same else None


def builtin_deployments() -> Deployments:
    """What quotaflow runs on with no deployments file: the simulated mock provider."""
    mock = Deployment(name=MOCK_PROVIDER, provider="mock", model="mock",
                      rpm=1_000_000, tpm=1_000_000_000)
    return Deployments(deployments={mock.name: mock}, routes={"*": Route(deployments=[mock.name])})


def load_deployments(path: Path | None) -> Deployments:
    """Read the TOML deployments file, or the built-in mock set when there is none."""
    if path is None:
        return builtin_deployments()
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"deployments file {path} does not exist") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"deployments file {path} is not valid TOML: {exc}") from exc
    tables = raw.get("deployments")
    if not isinstance(tables, dict) or not tables:
        raise ConfigError(f"deployments file {path} has no [deployments.NAME] tables")
    try:
        deployments = {
            name: Deployment(name=name, **table) for name, table in tables.items()
        }
        return Deployments(deployments=deployments, routes=raw.get("routes", {}))
    except (ValidationError, TypeError) as exc:
        raise ConfigError(f"deployments file {path} is invalid:\n{exc}") from exc

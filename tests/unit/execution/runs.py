"""Small real collaborators for the admission loop's and the attempts' unit tests: a
deployments file, the in-process limiter and circuit breaker, the in-process mock
provider (or a scripted one), and a BatchRun whose watch reads a scripted job status
instead of the database. Nothing here stores: the tests read the writer's buffer."""

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quotaflow.budget.buckets import LocalLimiter
from quotaflow.budget.circuit import LocalCircuitBreaker
from quotaflow.budget.limiter import Limiter
from quotaflow.budget.routing import Router
from quotaflow.config import Settings
from quotaflow.deployments.catalog import Deployments, Route
from quotaflow.dispatch.queues import BatchRef
from quotaflow.execution.admitted import Admitted
from quotaflow.execution.batch import BatchRun
from quotaflow.execution.feedback import Feedback
from quotaflow.execution.gate import Gate
from quotaflow.execution.hooks import BatchHook, Hooks
from quotaflow.execution.loops import ProviderPool
from quotaflow.execution.prepare import Preparer
from quotaflow.execution.retries import RetryPolicy
from quotaflow.execution.stopping import JobWatch
from quotaflow.execution.writer import ResultWriter
from quotaflow.providers import Provider
from quotaflow.providers.base import ProviderResponse
from quotaflow.providers.mock import MockProvider
from quotaflow.providers.outcomes import Outcome, Provenance
from quotaflow.results.leases import ClaimedItem

URL = "/v1/chat/completions"


def deployments(tmp_path: Path, name: str = "one", **fields: object) -> Deployments:
    """One mock deployment (model "m") serving every model, with `fields` set."""
    settings = {"provider": '"mock"', "model": '"m"', "rpm": 6000, "tpm": 6_000_000,
                **{k: repr(v) if isinstance(v, str) else v for k, v in fields.items()}}
    body = "".join(f"{key} = {value}\n" for key, value in settings.items())
    (tmp_path / "d.toml").write_text(
        f'[deployments.{name}]\n{body}[routes]\n"*" = "{name}"\n')
    return Settings(deployments_file=tmp_path / "d.toml").load_deployments()


def route(catalog: Deployments) -> Route:
    found = catalog.route_named(catalog.route_name_for("m"))
    assert found is not None
    return found


def items(count: int, max_tokens: int = 8) -> list[ClaimedItem]:
    return [ClaimedItem(n, f"c{n}", {"model": "m", "max_tokens": max_tokens, "messages": [
        {"role": "user", "content": f"line {n}"}]}, 0) for n in range(count)]


@dataclass
class ScriptedWatch(JobWatch):
    """A job whose status is `status` (None: running), read at once and at every ask."""

    status: str | None = None

    def __post_init__(self) -> None:
        self._checked = float("-inf")

    def ended(self) -> str | None:
        return self.status


@dataclass
class Journal(BatchHook):
    """A hook writing down what the loop told it; it may ask for waits before acquires."""

    waits: list[float] = field(default_factory=list)
    chunks: list[list[int]] = field(default_factory=list)
    retries: list[int] = field(default_factory=list)
    asked: int = 0

    def before_acquire(self, budget: Any) -> float | None:
        self.asked += 1
        return self.waits.pop(0) if self.waits else None

    def chunk_admitted(self, entries: Sequence[Admitted], waited_s: float) -> None:
        self.chunks.append([entry.item.line_no for entry in entries])

    def retry_admitted(self, entry: Admitted, waited_s: float) -> None:
        self.retries.append(entry.item.line_no)


class Scripted:
    """A provider that raises the given errors in turn, then answers as the mock does;
    it counts its calls and the most it had in flight at once."""

    def __init__(self, errors: Sequence[Exception] = (), latency_s: float = 0.0) -> None:
        self.errors, self.latency_s = list(errors), latency_s
        self.calls = self.flying = self.most_flying = 0
        self._mock = MockProvider()

    async def send(self, url: str, body: dict[str, Any]) -> ProviderResponse:
        self.calls += 1
        self.flying += 1
        self.most_flying = max(self.most_flying, self.flying)
        try:
            await asyncio.sleep(self.latency_s)
            if self.errors:
                raise self.errors.pop(0)
            return await self._mock.send(url, body)
        finally:
            self.flying -= 1

    async def aclose(self) -> None:
        return None


@dataclass
class Parts:
    """What a run's loop is built of, made from one deployments catalogue."""

    catalog: Deployments
    provider: Provider | None = None  # None: the mock provider
    limiter: Limiter = field(default_factory=LocalLimiter)
    breaker: LocalCircuitBreaker = field(default_factory=LocalCircuitBreaker)

    def gate(self) -> Gate:
        pool = ProviderPool() if self.provider is None else ProviderPool(
            lambda deployment: self.provider)  # type: ignore[arg-type, return-value]
        return Gate(Router(self.catalog, self.limiter, self.breaker), self.limiter,
                    Preparer(self.catalog, pool))

    def run(self, hooks: Sequence[BatchHook] = (), max_attempts: int = 3,
            status: str | None = None) -> BatchRun:
        return BatchRun(BatchRef("batch_unit", 0, 99), "owner", URL, 0.0,
                        RetryPolicy(max_attempts=max_attempts, base_delay_s=0.001),
                        ResultWriter(None, "batch_unit"),  # type: ignore[arg-type]
                        Feedback(self.limiter, self.breaker),
                        ScriptedWatch(None, "batch_unit", status=status),  # type: ignore[arg-type]
                        hooks=Hooks(hooks))


def outcomes(run: BatchRun) -> dict[int, tuple[Outcome, Provenance | None]]:
    """The run's finished items, by line, with their provenance (from its writer)."""
    buffer, provenance = run.writer._buffer, run.writer._provenance
    assert len({item.line_no for item, _ in buffer}) == len(buffer), "an item finished twice"
    return {item.line_no: (outcome, record)
            for (item, outcome), record in zip(buffer, provenance, strict=True)}

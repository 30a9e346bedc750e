"""The `local` provider: a model in this process, fed through a dynamic batcher.

The executor calls `send()` once per request, concurrently, as for any
provider; the requests of every batch run in the process meet in the
deployment's one DynamicBatcher, whose thread runs them on the model in
batches, a request of the realtime queue ahead of bulk ones already waiting; a
deployment on vLLM (`engine = "vllm"`) has no batcher of ours: each request
goes straight into vLLM's continuous batch, with its queue as its priority. The model
is loaded on first use and stays loaded for the life of
the process: one engine per deployment per process, until `close_engines()` shuts
them all down (the end of `quotaflow run`, a worker's shutdown): a request an
engine drops as it stops is handed back (EngineStopped), never failed. A Celery worker is
limited to the deployment it was started for (`serve_only`), so a worker
without a model never loads one by accident. torch and transformers are
imported only when an engine is built (quotaflow/providers/local/engine.py).
"""

import asyncio
import logging
import sys
import threading
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from quotaflow.deployments.catalog import Deployment
from quotaflow.errors import ConfigError, EngineStopped, RetryableProviderError
from quotaflow.providers.base import ProviderResponse
from quotaflow.providers.local.answers import answer_body
from quotaflow.providers.local.batcher import DynamicBatcher
from quotaflow.providers.local.requests import Engine, Part, parts_for
from quotaflow.providers.local.vllm_options import INSTALL_HINT
from quotaflow.providers.priority import engine_priority


@dataclass
class Runner:
    """A loaded engine and the batcher in front of it."""

    engine: Engine
    batcher: DynamicBatcher | None  # None: the engine schedules itself (vLLM)
    closed: bool = False

    @property
    def stopped(self) -> bool:
        """Shut down, or its engine found dead (vLLM's processes ended)."""
        return self.closed or bool(getattr(self.engine, "stopped", False))

    def close(self) -> None:
        self.closed = True
        if self.batcher is not None:
            self.batcher.close(timeout_s=CLOSE_BATCH_S)
        self.engine.close()


log = logging.getLogger(__name__)
# How long a closing batcher waits for the model batch in hand: the process is ending,
# and its thread (a daemon) goes with it.
CLOSE_BATCH_S = 5.0
_runners: dict[str, Runner] = {}
_lock = threading.Lock()
_allowed: frozenset[str] | None = None  # None: any local deployment (embedded runs)
_shutting_down = False  # a plain flag: set from signal handlers, where no lock may be taken


def shutting_down() -> None:
    """Say the process is ending (a worker told to stop): a request its engine drops from
    now on is handed back, not retried. Safe in a signal handler: one assignment."""
    global _shutting_down
    _shutting_down = True


def serve_only(names: Iterable[str] | None) -> None:
    """Celery workers call this at start: load only these deployments' models (or none).
    None lifts the restriction (the embedded runner loads whatever it needs)."""
    global _allowed
    _allowed = None if names is None else frozenset(names)


def load_engine(deployment: Deployment) -> Engine:
    if deployment.engine == "transformers":
        try:
            from quotaflow.providers.local.engine import TransformersEngine
        except ImportError as exc:
            raise ConfigError(
                f"deployment {deployment.name!r} runs on transformers, which is not "
                "installed; pip install 'quotaflow[local]'") from exc
        return TransformersEngine(deployment)
    if deployment.engine == "vllm":
        try:
            from quotaflow.providers.local.vllm_engine import VllmEngine
        except ImportError as exc:
            raise ConfigError(f"deployment {deployment.name!r} runs on vLLM, which this "
                              f"interpreter ({sys.executable}) cannot import ({exc}); "
                              f"{INSTALL_HINT}") from exc
        return VllmEngine(deployment)
    raise ConfigError(f"deployment {deployment.name!r}: unknown engine {deployment.engine!r}")


def runner_for(deployment: Deployment) -> Runner:
    """The deployment's engine and batcher, loaded once per process."""
    with _lock:
        if _allowed is not None and deployment.name not in _allowed:
            raise ConfigError(
                f"this worker holds no model for local deployment {deployment.name!r}; its "
                f"requests are run by `quotaflow worker --deployment {deployment.name}`")
        if _shutting_down:
            raise EngineStopped(f"{deployment.name}: this process is shutting down")
        runner = _runners.get(deployment.name)
        if runner is None:
            engine = load_engine(deployment)
            if deployment.engine == "vllm":
                runner = _runners[deployment.name] = Runner(engine, None)
                return runner
            batcher = DynamicBatcher(engine.run_batch, deployment.max_batch_size,
                                     deployment.max_batch_tokens,
                                     deployment.max_wait_ms / 1000,
                                     name=f"quotaflow-batcher-{deployment.name}")
            runner = _runners[deployment.name] = Runner(engine, batcher)
        return runner


def close_engines() -> None:
    """Shut down every engine this process loaded (vLLM's processes end with it); a
    request still in one is handed back. Called once the process is done with them."""
    shutting_down()
    with _lock:
        runners = list(_runners.values())
        _runners.clear()
    for runner in runners:
        try:
            runner.close()
        except Exception:  # one engine's failure must not keep the others running
            log.exception("closing a local engine failed")


class LocalProvider:
    """Sends each request to the deployment's batcher and answers in OpenAI's shapes."""

    def __init__(self, deployment: Deployment) -> None:
        self._deployment = deployment
        self.runner = runner_for(deployment)

    @property
    def aborts_when_stopped(self) -> bool:
        """vLLM's requests are aborted when their job is cancelled or expires
        (quotaflow/execution/abortable.py): one waiting in its queue frees its place."""
        return self.runner.batcher is None

    async def send(self, url: str, body: dict[str, Any]) -> ProviderResponse:
        deployment, runner = self._deployment, self.runner
        parts = parts_for(url, body, runner.engine, deployment)
        priority = engine_priority()  # the queue of the batch this call serves
        try:
            answers = await self._answers(parts, priority)
        except EngineStopped as exc:
            if _shutting_down or runner.closed:
                raise  # handed back, to run again elsewhere or later
            # Its processes died on their own: the engine is gone for this process.
            raise RetryableProviderError(f"{exc}; restart `quotaflow worker --deployment "
                                         f"{deployment.name}`") from exc
        answer = answer_body(url, deployment, parts, answers)
        usage = answer["usage"]
        return ProviderResponse(status_code=200, body=answer,
                                request_id=f"req_{uuid.uuid4().hex[:24]}",
                                prompt_tokens=usage["prompt_tokens"],
                                completion_tokens=usage.get("completion_tokens", 0))

    async def _answers(self, parts: list[Part], priority: int) -> list[Any]:
        deployment, runner = self._deployment, self.runner
        if runner.stopped:
            raise EngineStopped(f"{deployment.name}: the engine is shut down")
        if runner.batcher is None:  # vLLM: every request straight into its scheduler
            futures = [runner.engine.answer(p, priority) for p in parts]  # type: ignore[attr-defined]
        else:
            futures = [asyncio.wrap_future(runner.batcher.submit(
                p.kind, p.prompt_tokens, p.max_new_tokens, p.payload, priority))
                for p in parts]
        try:
            answers = await asyncio.wait_for(asyncio.gather(*futures), deployment.timeout_s)
        except asyncio.CancelledError:
            caller = asyncio.current_task()
            if runner.closed and caller is not None and not caller.cancelling():
                # The batcher dropped it as it closed: not this request's failure.
                raise EngineStopped(f"{deployment.name}: the engine shut down") from None
            raise
        except TimeoutError as exc:  # gather's cancellation takes them off the batcher
            raise RetryableProviderError(
                f"{deployment.name}: no answer within timeout_s={deployment.timeout_s:g}; "
                "raise timeout_s or lower max_batch_size (max_num_seqs for vLLM)") from exc
        return answers

    async def aclose(self) -> None:
        """The model outlives one batch run: it stays loaded for the next."""

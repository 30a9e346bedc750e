"""The `local` provider: a model in this process, fed through a dynamic batcher.

The executor calls `send()` once per request, concurrently, as for any
provider; the requests of every batch run in the process meet in the
deployment's one DynamicBatcher, whose thread runs them on the model in
batches, a request of the realtime queue ahead of bulk ones already waiting; a
deployment on vLLM (`engine = "vllm"`) has no batcher of ours: each request
goes straight into vLLM's continuous batch, with its queue as its priority.
Engines are loaded once per process and shut down with it (runners.py). torch and
transformers are imported only when an engine is built (engine.py).
"""

import asyncio
import uuid
from typing import Any

from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import EngineStopped, RetryableProviderError
from quotaflow.providers.base import ProviderResponse
from quotaflow.providers.local import runners
from quotaflow.providers.local.answers import answer_body
from quotaflow.providers.local.requests import Part, batch_kind, parts_for
from quotaflow.providers.local.runners import (  # the package's API: __all__
    Runner,
    _runners,
    close_engines,
    close_when_told,
    load_engine,
    runner_for,
    serve_only,
    shutting_down,
)
from quotaflow.providers.priority import engine_priority

__all__ = ["LocalProvider", "Runner", "_runners", "close_engines", "close_when_told",
           "load_engine", "runner_for", "serve_only", "shutting_down"]


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
            if runners.ending() or runner.closed:
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
            # No batcher: a vLLM engine, whose answer() the Engine protocol does not declare.
            futures = [runner.engine.answer(p, priority) for p in parts]  # type: ignore[attr-defined]
        else:
            futures = [asyncio.wrap_future(runner.batcher.submit(
                batch_kind(p), p.prompt_tokens, p.max_new_tokens, p.payload, priority))
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

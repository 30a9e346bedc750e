"""The vLLM engine: one AsyncLLM per worker process, fed by every batch the worker runs.

vLLM schedules continuously: a request joins the running batch at the next step
and leaves when it ends, over a paged KV cache, so requests of different batches
and jobs share one batch with no batcher of ours in front. Its asyncio API is
bound to the loop it first ran on, while a `--deployment` worker runs batches in
threads, each with a loop of its own (quotaflow/execution/loops.py); so the
engine lives on a thread and loop of its own, and callers reach it with
`run_coroutine_threadsafe`. Cancelling a caller (a timeout, a cancelled job)
cancels the engine task, and vLLM's generate() aborts the request on that
cancellation: it leaves the scheduler and its KV cache blocks are freed.

Prompts are tokenized here with the model's tokenizer, as the transformers
engine does, and sent as token ids: usage counts the same tokens either way.
A vision-language model's images go with them as vLLM's multimodal data, loaded
off the engine's loop (images.py). What a line asks of vLLM is built by
vllm_request.py, which is tested without vLLM.
This module imports vLLM; it is imported only when a deployment uses it.
"""

import asyncio
import logging
import threading
import uuid
from collections.abc import Coroutine, Hashable, Sequence
from concurrent.futures import Future
from typing import Any

from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import (
    ConfigError,
    EngineStopped,
    PermanentProviderError,
    RetryableProviderError,
)
from quotaflow.providers.local import children
from quotaflow.providers.local.images import load_image
from quotaflow.providers.local.prompt_ids import PromptIds
from quotaflow.providers.local.requests import (
    EMBED,
    Generated,
    GenerationRequest,
    Part,
)
from quotaflow.providers.local.sampling import VLLM_APPLIES, bad_request
from quotaflow.providers.local.vllm_adapters import adapter_steps, lora_requests
from quotaflow.providers.local.vllm_options import (
    check_device,
    check_model_path,
    engine_args,
    lower_children_priority,
)
from quotaflow.providers.local.vllm_request import (
    generated_from,
    prompt_kwargs,
    sampling_kwargs,
    structured_option,
)

try:
    import vllm
    import vllm.sampling_params
    from transformers import AutoProcessor, AutoTokenizer
    from vllm import AsyncEngineArgs, PoolingParams, SamplingParams, TokensPrompt
    from vllm.exceptions import VLLMClientError
    from vllm.lora.request import LoRARequest
    from vllm.platforms import current_platform
    from vllm.sampling_params import RequestOutputKind
    from vllm.utils.gc_utils import freeze_gc_heap
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.exceptions import EngineDeadError
except ImportError as exc:  # the provider turns this into a ConfigError naming the fix
    raise ImportError(f"vLLM is not importable: {exc}") from exc

log = logging.getLogger(__name__)
LOAD_TIMEOUT_S = 900.0
# How long vLLM's processes get to end after its shutdown asks them (they are killed
# after that): a command must end within seconds of its job, or of a signal.
CLOSE_TIMEOUT_S = 4.0
STRUCTURED = structured_option(vllm.sampling_params)


class VllmEngine(PromptIds):
    """vLLM's async engine on a thread of its own, and the model's tokenizer."""

    applies = VLLM_APPLIES  # stop, seed, n, logprobs, penalties, response_format, ...

    def __init__(self, deployment: Deployment) -> None:
        self.name = deployment.name
        check_model_path(deployment)
        check_device(deployment, current_platform.device_type or "")
        # Each LoRA adapter's request, its directory checked before minutes of loading.
        self._loras: dict[str, LoRARequest] = lora_requests(deployment)
        self.tokenizer = AutoTokenizer.from_pretrained(deployment.model_path)
        self.tokenizer_lock = threading.Lock()  # the Rust tokenizer is not re-entrant
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name=f"quotaflow-vllm-{deployment.name}")
        self._thread.start()
        args = AsyncEngineArgs(**engine_args(deployment))
        log.info("%s: loading %s on vLLM %s (%s)", self.name, deployment.model_path,
                 vllm.__version__, current_platform.device_type)
        try:
            self.llm: AsyncLLM = self._call(self._start(args, self.name, self._loras)).result(
                LOAD_TIMEOUT_S)
        except Exception as exc:
            self._loop.call_soon_threadsafe(self._loop.stop)
            raise ConfigError(f"deployment {self.name!r}: vLLM could not load "
                              f"{deployment.model_path}: {exc}") from exc
        # Its processes, ended with it whatever state they are left in (children.py).
        self._children = children.note()
        self.stopped = False  # set once it is shut down, or found dead
        threads = lower_children_priority(deployment.engine_nice)
        # What loading made (torch's, transformers' and vLLM's objects) out of the collector's
        # sight, as vLLM's own servers do once started: each full collection walked them
        # all, about half a second of one worker thread's CPU in a job of 512 answers
        # (docs/benchmarks.md, "On vLLM's engine"), taken from the engine beside it.
        freeze_gc_heap()
        log.info("%s: vLLM's engine processes (%d threads) run %d steps below the worker",
                 self.name, threads, deployment.engine_nice)
        config = self.llm.model_config
        self.max_context: int | None = config.max_model_len
        self.serves_embeddings = config.runner_type == "pooling"
        self.version = vllm.__version__
        # A vision-language model takes image parts; its chat template (the one that
        # places the image token) may be the processor's rather than the tokenizer's.
        self.takes_images = bool(getattr(config, "is_multimodal_model", False))
        if self.takes_images:
            try:
                processor = AutoProcessor.from_pretrained(deployment.model_path)
            except (OSError, ValueError):  # no processor files: the tokenizer's template
                processor = None
            if getattr(processor, "chat_template", None):
                self.templater = processor

    @staticmethod
    async def _start(args: "AsyncEngineArgs", name: str,
                     loras: dict[str, "LoRARequest"]) -> "AsyncLLM":
        """The engine, with its LoRA adapters loaded (and their steps logged) where it
        has any: their first lines do not pay for reading them."""
        if not loras:
            return AsyncLLM.from_engine_args(args)
        llm = AsyncLLM.from_engine_args(args, stat_loggers=[adapter_steps(name)])
        for lora in loras.values():
            await llm.add_lora(lora)
        log.info("%s: LoRA adapters %s loaded", name, ", ".join(loras))
        return llm

    def _call(self, coroutine: Coroutine[Any, Any, Any]) -> Future[Any]:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def run_batch(self, kind: Hashable, payloads: Sequence[Any]) -> list[Any]:
        """The Engine protocol's batch call, for callers without a loop (the benchmark); a
        generation's answer is the list of its choices."""
        futures = [self._call(self._one(Part(str(kind), 0, 0, p), 1)) for p in payloads]
        return [f.result() for f in futures]

    async def answer(self, part: Part, priority: int) -> Any:
        """One request's answer, run on the engine's loop; cancelling the caller aborts it.
        A request the engine drops as it shuts down is handed back (EngineStopped)."""
        if self.stopped:
            raise EngineStopped(f"{self.name}: vLLM's engine is shut down")
        try:
            return await asyncio.wrap_future(self._call(self._one(part, priority)))
        except asyncio.CancelledError:
            caller = asyncio.current_task()
            if self.stopped and caller is not None and not caller.cancelling():
                raise EngineStopped(f"{self.name}: vLLM's engine shut down") from None
            raise

    async def _one(self, part: Part, priority: int) -> Any:
        request_id = uuid.uuid4().hex
        try:
            lora = self._loras[part.adapter] if part.adapter else None
            if part.kind == EMBED:
                prompt = TokensPrompt(prompt_token_ids=part.payload)
                return await self._embed(prompt, request_id, priority, lora)
            request: GenerationRequest = part.payload
            # A fetch blocks: off the engine's loop, and only for a prompt with images.
            images = (await asyncio.to_thread(lambda: [load_image(i) for i in request.images])
                      if request.images else [])
            prompt = TokensPrompt(**prompt_kwargs(request, images))
            return await self._generate(prompt, request, request_id, priority, lora)
        except asyncio.CancelledError:  # vLLM's generate() has aborted it on the way out
            log.info("%s: request %s aborted in vLLM (priority %d)", self.name, request_id,
                     priority)
            raise
        except (PermanentProviderError, RetryableProviderError):
            raise
        except (ValueError, VLLMClientError) as exc:  # vLLM refused the request itself
                raise bad_request(f"{self.name}: {exc}") from exc
        except EngineDeadError as exc:  # its processes ended (a signal to the group?)
            self.stopped = True
            raise EngineStopped(f"{self.name}: vLLM's engine has ended") from exc
        except Exception as exc:  # the engine failed a step: try again later
            if self.stopped:
                raise EngineStopped(f"{self.name}: vLLM's engine shut down") from exc
            raise RetryableProviderError(f"{self.name}: vLLM failed: {exc}") from exc

    async def _generate(self, prompt: "TokensPrompt", request: GenerationRequest,
                        request_id: str, priority: int,
                        lora: "LoRARequest | None" = None) -> list[Generated]:
        params = SamplingParams(**sampling_kwargs(request, STRUCTURED),
                                output_kind=RequestOutputKind.FINAL_ONLY)
        final = None
        async for output in self.llm.generate(prompt, params, request_id, priority=priority,
                                              lora_request=lora):
            final = output
        if final is None or not final.outputs:
            raise RetryableProviderError(f"{self.name}: vLLM ended request {request_id} "
                                         "without an answer")
        return generated_from(final, request)

    async def _embed(self, prompt: "TokensPrompt", request_id: str, priority: int,
                     lora: "LoRARequest | None" = None) -> list[float]:
        if not self.serves_embeddings:
                raise bad_request(f"deployment {self.name!r} runs its model for generation; "
                              "embeddings need runner = 'pooling'")
        final = None
        async for output in self.llm.encode(prompt, PoolingParams(task="embed"), request_id,
                                            priority=priority, lora_request=lora):
            final = output
        assert final is not None
        return [float(x) for x in final.outputs.data.tolist()]

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Shut the engine down: its requests still running are handed back, vLLM's
        processes end (or are killed after `timeout_s`), and the loop's thread stops.
        Without this the process could not exit: the interpreter's exit handler waits on
        vLLM's engine process, which waits on the loop this thread still runs."""
        self.stopped = True
        noted = {**self._children, **children.note()}
        if self._thread.is_alive():
            stopping = self._call(self._stop(timeout_s))
            try:
                stopping.result(timeout_s + 2)
            except Exception as exc:  # ending it is all that matters now
                log.warning("%s: vLLM's shutdown: %s", self.name, exc)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(2)
        killed = children.end(noted, grace_s=1.0)
        if killed:
            log.warning("%s: vLLM's processes %s outlived its shutdown: killed", self.name,
                        killed)
        log.info("%s: vLLM's engine is shut down", self.name)

    async def _stop(self, timeout_s: float) -> None:
        """On the engine's loop: cancel the requests on it (their callers hand them back),
        then vLLM's own shutdown, which ends its processes and its output task."""
        me = asyncio.current_task()
        requests = [t for t in asyncio.all_tasks() if t is not me]
        for task in requests:
            task.cancel()
        if requests:
            await asyncio.wait(requests, timeout=1.0)
        self.llm.shutdown(timeout=timeout_s)

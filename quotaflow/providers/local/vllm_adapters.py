"""LoRA adapters on vLLM's engine: one LoRARequest per adapter, and what the engine ran.

vLLM serves every adapter of a deployment in its one continuous batch: each request
carries its adapter's LoRARequest, and the engine's LoRA kernels apply each row's own
adapter in the same step (max_loras: all of them, vllm_lora_args in adapters.py). The
adapters are loaded when the engine starts, not by their first line. What the
scheduler ran is seen through a stat logger of vLLM's own interface: it logs each time
a step holds requests of more models (adapters, or the base) than any step before, so
an operator (and the tests) can see adapters batched together rather than in turn.
Enabling it makes vLLM gather its per-step stats, so only deployments with adapters do.
This module imports vLLM; it is imported only by vllm_engine.py.
"""

import logging
from collections.abc import Callable
from typing import Any

from vllm.lora.request import LoRARequest
from vllm.v1.metrics.loggers import StatLoggerBase

from quotaflow.deployments.deployment import Deployment
from quotaflow.providers.local.adapters import adapter_dirs, adapter_ids

log = logging.getLogger(__name__)


def lora_requests(deployment: Deployment) -> dict[str, LoRARequest]:
    """Each adapter's LoRARequest (name, stable id, directory), by name."""
    dirs, ids = adapter_dirs(deployment), adapter_ids(deployment)
    return {name: LoRARequest(name, ids[name], str(path)) for name, path in dirs.items()}


class AdapterSteps(StatLoggerBase):  # type: ignore[misc]  # vLLM is untyped here
    """Logs the first step that runs requests of more models at once than any step before
    (each adapter is one, the base weights another), with how many of each."""

    def __init__(self, vllm_config: Any, engine_index: int = 0, name: str = "") -> None:
        self.name = name
        self.most = 0

    def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
               engine_idx: int = 0) -> None:
        running = dict(getattr(scheduler_stats, "running_lora_adapters", None) or {})
        base = (getattr(scheduler_stats, "num_running_reqs", 0) or 0) - sum(running.values())
        if base > 0:
            running["(base)"] = base
        held = sum(1 for count in running.values() if count > 0)
        if held > self.most:
            self.most = held
            together = ", ".join(f"{name}: {count}" for name, count in sorted(running.items()))
            log.info("%s: vLLM ran requests of %d models in one step (%s)", self.name, held,
                     together)

    def log_engine_initialized(self) -> None:
        """Nothing to say: the engine's own start is logged by vllm_engine.py."""


def adapter_steps(name: str) -> Callable[[Any, int], AdapterSteps]:
    """The stat-logger factory vLLM calls once per engine core, for deployment `name`."""
    def made(vllm_config: Any, engine_index: int = 0) -> AdapterSteps:
        return AdapterSteps(vllm_config, engine_index, name)
    return made

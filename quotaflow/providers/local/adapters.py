"""Which LoRA adapter a line runs with, and the adapters' directories, checked at load.

Torch-, peft- and vLLM-free, so both engines share it and it is unit-tested alone. A
line's `model` picks the adapter (as on vLLM's own server); a line without one, or
naming the deployment's `model`, runs on the base weights; on a deployment with
adapters any other model fails its line (400, naming it), since answering it from
some other weights would be a silent substitution. A deployment without adapters
answers whatever model its route sends, as before adapters existed.
"""

import json
from pathlib import Path
from typing import Any

from quotaflow.deployments.deployment import Deployment
from quotaflow.errors import ConfigError
from quotaflow.providers.local.sampling import bad_request

CONFIG_FILE = "adapter_config.json"
# The ranks vLLM's LoRA kernels are built for (its LoRAConfig.max_lora_rank).
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def adapter_for(body: dict[str, Any], deployment: Deployment) -> str | None:
    """The adapter a request body's `model` names; None: the base weights."""
    model = body.get("model")
    if not deployment.adapters or model is None or model == deployment.model:
        return None
    if model in deployment.adapters:
        return str(model)
    served = ", ".join(repr(m) for m in (deployment.model, *deployment.adapters))
    raise bad_request(f"deployment {deployment.name!r} does not serve model {model!r}; its "
                      f"models are {served} (the base model, then its LoRA adapters)", "model")


def adapter_dirs(deployment: Deployment) -> dict[str, Path]:
    """Each adapter's directory, refused (ConfigError naming it) where peft's
    save_pretrained did not write one there: before minutes of loading the model."""
    found = {}
    for name, path in deployment.adapters.items():
        where = Path(path).expanduser()
        if not (where / CONFIG_FILE).is_file():
            raise ConfigError(f"deployment {deployment.name!r}: adapter {name!r} at {where} "
                              f"holds no {CONFIG_FILE}; give a directory written by peft's "
                              "save_pretrained")
        found[name] = where
    return found


def adapter_rank(path: Path) -> int:
    """The largest LoRA rank an adapter uses: its `r`, or a larger one in `rank_pattern`."""
    config = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
    ranks = [int(config.get("r") or 0), *(int(r) for r in
                                           (config.get("rank_pattern") or {}).values())]
    return max(ranks)


def vllm_lora_args(deployment: Deployment) -> dict[str, Any]:
    """vLLM's LoRA engine arguments: every adapter may run in one batch (max_loras), at
    the smallest rank vLLM builds its kernels for that holds the largest adapter's.

    One slot more than there are adapters, left empty: vLLM's CPU LoRA ops (0.32) index
    a base-model row's "no adapter" (-1) as the last slot, so with every slot taken the
    base model's lines in a batch with adapters ran with the last adapter. The empty
    slot's weights are zeros, and cost one adapter's memory on other platforms."""
    if not deployment.adapters:
        return {}
    largest = max(adapter_rank(path) for path in adapter_dirs(deployment).values())
    rank = next((r for r in VLLM_RANKS if r >= largest), None)
    if rank is None:
        raise ConfigError(f"deployment {deployment.name!r}: an adapter of rank {largest} is "
                          f"above vLLM's largest LoRA rank, {VLLM_RANKS[-1]}")
    count = len(deployment.adapters) + 1  # the empty slot
    return {"enable_lora": True, "max_loras": count, "max_cpu_loras": count,
            "max_lora_rank": rank}


def adapter_ids(deployment: Deployment) -> dict[str, int]:
    """A stable id per adapter (vLLM's lora_int_id, from 1): its place in the file."""
    return {name: index for index, name in enumerate(deployment.adapters, start=1)}

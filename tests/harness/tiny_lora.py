"""Tiny random LoRA adapters for the tiny models of tiny_model.py, written at test time.

peft's LoraConfig and get_peft_model on the base model read back from its directory,
then every LoRA weight set to random values of its own seed: peft starts B at zero
(an adapter that changes nothing), and the tests need adapters whose answers differ
from each other's and from the base model's. save_pretrained writes what a trained
adapter's directory holds (adapter_config.json, adapter_model.safetensors), which
peft and vLLM both load.
"""

import warnings
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

# Every projection vLLM's Llama takes LoRA on (it packs q/k/v and gate/up itself).
LLAMA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def save_tiny_lora(base_dir: Path, path: Path, *, seed: int, rank: int = 8,
                   scale: float = 0.3) -> Path:
    """An adapter of `rank` on the model at `base_dir`, its A and B weights drawn from
    N(0, scale) with `seed`; returns `path`."""
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                        target_modules=list(LLAMA_MODULES))
    with warnings.catch_warnings():
        # peft asks transformers 5 for a property it deprecated (pytest makes it an error).
        warnings.filterwarnings("ignore", category=FutureWarning,
                                message=".*is_gradient_checkpointing")
        adapted = get_peft_model(model, config)
    draw = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, weight in adapted.named_parameters():
            if "lora_" in name:
                weight.copy_(torch.randn(weight.shape, generator=draw) * scale)
    path.mkdir(parents=True, exist_ok=True)
    adapted.save_pretrained(path)
    return path

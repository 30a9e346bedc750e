"""Tokens/s of the local provider's batched path against one request at a time.

    python -m bench.local_batching                       # tiny GPT-2 on CPU (docs/benchmarks.md)
    python -m bench.local_batching --preset qwen2-0.5b --device cuda --requests 256 \\
        --batch-size 64 --max-tokens 128                 # ~0.5B Qwen2, random weights, GPU
    python -m bench.local_batching --engine vllm         # + vLLM rows (bench/local_vllm.py)
    python -m bench.local_batching --engine vllm --stepped   # stepped load (bench/local_stepped.py)

`--engine vllm` runs bench/local_vllm.py (or, with --stepped, bench/local_stepped.py)
under vLLM's interpreter, made or found by scripts/vllm-venv; the other options go to it.

Both paths run the same model, loaded by the real loading code from a
directory written with save_pretrained (random weights: no hub access is
needed or used), on the same prompts with greedy decoding. "one at a time"
generates each request alone, as a server without batching would; "batched"
sends every request concurrently through LocalProvider.send, as the executor
does, so the DynamicBatcher forms the model batches. tokens/s counts the
completion tokens the answers report. On CUDA the table adds the peak GPU
memory of each run.
"""

import argparse
import asyncio
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# Set before transformers is imported: it reads them once.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch

from quotaflow.constants import ENDPOINT_CHAT
from quotaflow.deployments.deployment import Deployment
from quotaflow.providers.local import LocalProvider, runner_for
from quotaflow.providers.local.requests import GenerationRequest
from tests.harness.tiny_model import SENTENCES, save_tiny_model

PRESETS = {
    # What the tests use, a little wider: small enough for CPU.
    "tiny": {"arch": "gpt2", "hidden": 64, "layers": 2, "heads": 2, "kv_heads": None,
             "intermediate": 256, "vocab": None, "context": 512},
    # Qwen2.5-0.5B's shapes (494M parameters), random weights.
    "qwen2-0.5b": {"arch": "qwen2", "hidden": 896, "layers": 24, "heads": 14, "kv_heads": 2,
                   "intermediate": 4864, "vocab": 151936, "context": 4096},
    # A Llama of about the same size.
    "llama-0.5b": {"arch": "llama", "hidden": 1024, "layers": 16, "heads": 16, "kv_heads": 4,
                   "intermediate": 4096, "vocab": 32000, "context": 4096},
}


@dataclass
class Run:
    mode: str
    batch_size: int
    seconds: float
    completion_tokens: int
    batches: int
    peak_gib: float | None

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.seconds


def max_tokens_of(i: int, max_tokens: int, mixed: bool) -> int:
    """With --mixed-lengths a quarter of the requests each ask for 1/4, 2/4, 3/4 and all
    of max_tokens, as replies of different lengths end at different times."""
    return max(1, max_tokens * (1 + i % 4) // 4) if mixed else max_tokens


def messages(i: int) -> list[dict[str, str]]:
    words = " ".join(SENTENCES[(i + k) % len(SENTENCES)] for k in range(1 + i % 3))
    return [{"role": "user", "content": f"{words} number {i}"}]


def peak_gib(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**30


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def one_at_a_time(provider: LocalProvider, count: int, max_tokens: int,
                  mixed: bool = False) -> Run:
    engine = provider.runner.engine
    requests = [GenerationRequest(engine.chat_ids(messages(i)),
                                  max_tokens_of(i, max_tokens, mixed), 0.0, 1.0)
                for i in range(count)]
    reset_peak(engine.device)
    started = time.perf_counter()
    tokens = sum(engine.generate([r])[0].completion_tokens for r in requests)
    seconds = time.perf_counter() - started
    return Run("one at a time", 1, seconds, tokens, count, peak_gib(engine.device))


def batched(provider: LocalProvider, count: int, max_tokens: int, mixed: bool = False) -> Run:
    engine, batcher = provider.runner.engine, provider.runner.batcher

    async def send_all() -> list:
        return await asyncio.gather(*(
            provider.send(ENDPOINT_CHAT, {"messages": messages(i),
                                          "max_tokens": max_tokens_of(i, max_tokens, mixed),
                                          "temperature": 0}) for i in range(count)))

    before = len(batcher.batch_sizes)
    reset_peak(engine.device)
    started = time.perf_counter()
    answers = asyncio.run(send_all())
    seconds = time.perf_counter() - started
    tokens = sum(a.completion_tokens for a in answers)
    return Run("batched", batcher.max_batch_size, seconds, tokens,
               len(batcher.batch_sizes) - before, peak_gib(engine.device))


def build(args: argparse.Namespace, directory: Path) -> Deployment:
    shape = {**PRESETS[args.preset], **{k: v for k, v in vars(args).items()
                                        if k in PRESETS["tiny"] and v is not None}}
    save_tiny_model(directory, arch=shape["arch"], hidden=shape["hidden"],
                    layers=shape["layers"], heads=shape["heads"], kv_heads=shape["kv_heads"],
                    intermediate=shape["intermediate"], vocab_size=shape["vocab"],
                    context=shape["context"], eos_bias=-100.0)
    print(f"model: {args.preset} {shape}")
    return Deployment(name=f"bench-{args.preset}", provider="local", model=args.preset,
                      model_path=str(directory), device=args.device, dtype=args.dtype,
                      max_batch_size=args.batch_size, max_batch_tokens=args.max_batch_tokens,
                      max_wait_ms=args.max_wait_ms, default_max_tokens=args.max_tokens,
                      timeout_s=3600, rpm=1_000_000, tpm=1_000_000_000)


def run_vllm_rows(argv: list[str]) -> None:
    """Hand over to the vLLM benchmarks, under an interpreter that has vLLM."""
    root = Path(__file__).resolve().parents[1]
    made = subprocess.run(["bash", str(root / "scripts" / "vllm-venv")], check=True,
                          capture_output=True, text=True)
    python = made.stdout.strip().splitlines()[-1]
    module = "bench.local_stepped" if "--stepped" in argv else "bench.local_vllm"
    rest = [a for a in argv if a != "--stepped"]
    env = {**os.environ, "PYTHONPATH": str(root)}
    os.execve(python, [python, "-m", module, *rest], env)


def main() -> None:
    engine = argparse.ArgumentParser(add_help=False)
    engine.add_argument("--engine", choices=("transformers", "vllm"), default="transformers")
    chosen, rest = engine.parse_known_args()
    if chosen.engine == "vllm":
        run_vllm_rows(rest)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--arch", choices=("gpt2", "llama", "qwen2"))
    for option in ("hidden", "layers", "heads", "kv-heads", "intermediate", "vocab", "context"):
        parser.add_argument(f"--{option}", type=int)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "float16",
                                                            "bfloat16"))
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-batch-tokens", type=int, default=1_000_000)
    parser.add_argument("--max-wait-ms", type=float, default=20.0)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--mixed-lengths", action="store_true",
                        help="requests ask for 1/4, 2/4, 3/4 or all of --max-tokens")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    args = parser.parse_args(rest)
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="qf-bench-") as directory:
        deployment = build(args, Path(directory))
        provider = LocalProvider(deployment)
        engine = runner_for(deployment).engine
        print(f"device: {engine.device}, dtype: {str(engine.dtype).removeprefix('torch.')}, "
              f"torch threads: {torch.get_num_threads()}, torch {torch.__version__}")
        batched(provider, min(args.requests, args.batch_size), 4)  # warm up both paths
        one_at_a_time(provider, 2, 4)
        runs = [one_at_a_time(provider, args.requests, args.max_tokens, args.mixed_lengths),
                batched(provider, args.requests, args.max_tokens, args.mixed_lengths)]
    print_table(args, runs)


def print_table(args: argparse.Namespace, runs: list[Run]) -> None:
    lengths = " (1/4 to all of it, mixed)" if args.mixed_lengths else ""
    print(f"\n{args.requests} chat requests, max_tokens {args.max_tokens}{lengths}, greedy; "
          f"max_batch_size {args.batch_size}, max_batch_tokens {args.max_batch_tokens:,}, "
          f"max_wait_ms {args.max_wait_ms:g}")
    header = ("mode", "batch", "model batches", "tokens", "seconds", "tokens/s", "speedup",
              "peak GPU GiB")
    base = runs[0].tokens_per_s
    rows = [(r.mode, str(r.batch_size), str(r.batches), f"{r.completion_tokens:,}",
             f"{r.seconds:.2f}", f"{r.tokens_per_s:,.0f}", f"{r.tokens_per_s / base:.1f}x",
             "-" if r.peak_gib is None else f"{r.peak_gib:.2f}") for r in runs]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()

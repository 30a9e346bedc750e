"""Fixed batches, async calls and continuous batching under stepped offered load.

    python -m bench.local_batching --engine vllm --stepped      # finds vLLM's venv itself
    $(bash scripts/vllm-venv) -m bench.local_stepped --rates 5,40,200 --step-s 8
    ... --device cuda --dtype bfloat16 --rates 50,400,2000     # on a GPU host (vllm)

Three ways to serve the same requests (bench/local_vllm.py's model and prompts),
each fed the same Poisson arrivals at a low, a middle and an overloading rate,
one step after the other (step_s each), then drained for at most drain_s:

- fixed: quotaflow's transformers engine making fixed batches (max_batch_size 32,
  waiting up to 200 ms to fill one); a batch runs to its end before the next starts;
- async: 16 slots, each sending one request at a time to an engine that runs one
  request at a time (transformers, max_batch_size 1), as a client with 16 concurrent
  calls against an unbatched server;
- hybrid: vLLM's engine in process: every request joins the running batch at the
  next step (continuous batching), up to max_num_seqs.

Per step: offered and answered requests/s (answers arriving during the step),
p50/p99 latency (arrival to answer) of the step's requests that were answered,
how many of them never were (by the end of the drain), the peak memory (RSS of this
process and its children, vLLM's engine core included; on CUDA the device's peak
memory in use too) and, at the top step, the queue: requests arrived and not yet
answered when its arrivals stop.
"""

import argparse
import asyncio
import contextlib
import random
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from bench.local_vllm import body, deployment, percentile, write_model
from quotaflow.constants import ENDPOINT_CHAT, QUEUE_BULK
from quotaflow.providers.local import LocalProvider
from quotaflow.providers.priority import current_queue

ASYNC_SLOTS = 16
FIXED_BATCH = 32


@dataclass
class Step:
    rate: float
    offered: int = 0
    answered_in_step: int = 0
    latencies: list[float] = field(default_factory=list)
    tokens: int = 0
    queue_at_end: int = 0


class MemoryPeak:
    """Samples the RSS of this process tree (and the GPU's memory in use) every 100 ms."""

    def __init__(self, cuda: bool) -> None:
        self.peak_rss, self.peak_gpu, self._cuda = 0, 0, cuda
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(0.1):
            rss = 0
            for proc in [me, *me.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    rss += proc.memory_info().rss
            self.peak_rss = max(self.peak_rss, rss)
            if self._cuda:
                import torch
                free, total = torch.cuda.mem_get_info()
                self.peak_gpu = max(self.peak_gpu, total - free)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


async def serve(provider: LocalProvider, rates: list[float], step_s: float, drain_s: float,
                max_tokens: int, slots: int | None, seed: int) -> list[Step]:
    """Poisson arrivals step by step; `slots` bounds the calls in flight (async mode)."""
    current_queue.set(QUEUE_BULK)
    steps = [Step(rate) for rate in rates]
    start = time.perf_counter()
    bounds = [start + step_s * (k + 1) for k in range(len(rates))]
    gate = asyncio.Semaphore(slots) if slots else None
    outstanding = 0
    tasks = []

    async def one(i: int, step: Step, arrived: float) -> None:
        nonlocal outstanding
        try:
            if gate:
                async with gate:
                    answer = await provider.send(ENDPOINT_CHAT, body(i, max_tokens))
            else:
                answer = await provider.send(ENDPOINT_CHAT, body(i, max_tokens))
        finally:
            outstanding -= 1
        now = time.perf_counter()
        step.latencies.append(now - arrived)
        step.tokens += answer.completion_tokens
        for k, bound in enumerate(bounds):
            if now <= bound:
                steps[k].answered_in_step += 1
                break

    chance = random.Random(seed)
    i = 0
    for k, step in enumerate(steps):
        at = time.perf_counter()
        while True:
            at += chance.expovariate(step.rate)
            if at >= bounds[k]:
                break
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            outstanding += 1
            step.offered += 1
            tasks.append(asyncio.ensure_future(one(i, step, time.perf_counter())))
            i += 1
        await asyncio.sleep(max(0.0, bounds[k] - time.perf_counter()))
        step.queue_at_end = outstanding
    _done, pending = await asyncio.wait(tasks, timeout=drain_s) if tasks else (set(), set())
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    return steps


def run_mode(mode: str, model_dir: Path, args: argparse.Namespace) -> tuple[list[Step], int,
                                                                            int]:
    args.batch_size = FIXED_BATCH if mode == "fixed" else 1
    spec = deployment(model_dir, args, engine="vllm" if mode == "hybrid" else "transformers")
    if mode == "fixed":
        spec = spec.model_copy(update={"max_wait_ms": 200.0})
    provider = LocalProvider(spec)
    asyncio.run(serve(provider, [20.0], 0.3, 30, 4, None, 0))  # warm-up
    memory = MemoryPeak(args.device.startswith("cuda"))
    steps = asyncio.run(serve(provider, args.rate_list, args.step_s, args.drain_s,
                              args.max_tokens, ASYNC_SLOTS if mode == "async" else None,
                              args.seed))
    memory.stop()
    engine = provider.runner.engine
    if hasattr(engine, "close"):
        engine.close()
    from quotaflow.providers import local
    local._runners.clear()
    return steps, memory.peak_rss, memory.peak_gpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rates", default="5,40,200", help="requests/s of each step")
    parser.add_argument("--step-s", type=float, default=8.0)
    parser.add_argument("--drain-s", type=float, default=15.0)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--modes", default="fixed,async,hybrid")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    args.rate_list = [float(r) for r in args.rates.split(",")]
    cuda = args.device.startswith("cuda")
    print(f"stepped load: {args.rates} req/s, {args.step_s:g} s a step, drain "
          f"{args.drain_s:g} s; max_tokens {args.max_tokens}, greedy; device {args.device}")
    header = ["mode", "offered/s", "answered/s", "tokens/s", "p50 s", "p99 s", "unanswered",
              "queue at end", "peak RSS GiB"] + (["peak GPU GiB"] if cuda else [])
    table = [header]
    with tempfile.TemporaryDirectory(prefix="qf-stepped-") as directory:
        model_dir = write_model(Path(directory) / "model")
        for mode in args.modes.split(","):
            steps, rss, gpu = run_mode(mode, model_dir, args)
            for k, step in enumerate(steps):
                lat = step.latencies or [float("nan")]
                top = k == len(steps) - 1
                row = [mode if k == 0 else "", f"{step.offered / args.step_s:.1f}",
                       f"{step.answered_in_step / args.step_s:.1f}",
                       f"{step.tokens / args.step_s:,.0f}", f"{statistics.median(lat):.2f}",
                       f"{percentile(lat, 0.99):.2f}",
                       str(step.offered - len(step.latencies)),
                       str(step.queue_at_end) if top else "", f"{rss / 2**30:.2f}" if top
                       else ""] + ([f"{gpu / 2**30:.2f}" if top else ""] if cuda else [])
                table.append(row)
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()

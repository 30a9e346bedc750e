"""Cold against warm start: a fresh vLLM engine's first requests, with and without the
warm-up it now runs at load (quotaflow/providers/local/warmup.py).

Part of bench/local_vllm.py (`--only warm-start`; its interpreter, its model). For each
start, a fresh engine is loaded; then the first N requests are sent at once, then N
more with other prompts (vLLM's prefix cache would flatter the same ones): the first
burst's rate against the second's is what a job's first lines see against its steady
rate. Cold: the engine as loaded, no warm-up; warm: warmed up at load, as
`runner_for` does (its time is printed, and left out of the rows, as the model load is).
"""

import argparse
import time
from collections.abc import Callable
from typing import Any

from quotaflow.deployments.deployment import Deployment
from quotaflow.providers import local
from quotaflow.providers.local import LocalProvider, Runner, load_engine
from quotaflow.providers.local.warmup import warm_up

# Prompt numbers of the second burst: far from the first's, so no prefix is shared.
LATER = 50_000


def start(deployment: Deployment, warmed: bool) -> tuple[LocalProvider, float, float]:
    """A fresh engine for the deployment, warmed or not: its provider, the seconds its
    load took and those its warm-up took."""
    loading = time.perf_counter()
    engine = load_engine(deployment)
    loaded = time.perf_counter() - loading
    warming = warm_up(engine, deployment.name) if warmed else 0.0
    local._runners[deployment.name] = Runner(engine, None)
    return LocalProvider(deployment), loaded, warming


def warm_start(deployment: Deployment, args: argparse.Namespace,
               at_once: Callable[..., Any]) -> None:
    """The cold and warm rows, through bench/local_vllm.py's `at_once`."""
    count, table, notes = args.first_requests, [], []
    for warmed in (False, True):
        provider, loaded, warming = start(deployment, warmed)
        name = "warm (warmed up at load)" if warmed else "cold (no warm-up)"
        first = at_once(provider, f"{name}: first {count}", count, args.max_tokens)
        then = at_once(provider, f"{name}: next {count}", count, args.max_tokens, first=LATER)
        table += [(row.mode, f"{row.seconds:.2f}", f"{row.per_s:,.1f}",
                   f"{row.completion_tokens / row.seconds:,.0f}",
                   f"{row.per_s / then.per_s:.2f}") for row in (first, then)]
        notes.append(f"{name}: model load {loaded:.1f} s, warm-up {warming:.1f} s")
        provider.runner.close()
        local._runners.clear()
    print(f"\nWarm start: a fresh engine's first {count} chat requests at once, then {count} "
          f"more (max_tokens {args.max_tokens}, greedy)")
    header = ("start", "seconds", "req/s", "tokens/s", "of the next burst's rate")
    widths = [max(len(row[i]) for row in [header, *table]) for i in range(len(header))]
    for row in [header, *table]:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
    for note in notes:
        print(note)

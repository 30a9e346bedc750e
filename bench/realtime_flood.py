"""Realtime latency under a bulk flood, by worker layout; prints a table.

Each layout runs on a cluster of its own (tests/harness/realtime_flood.py: a strict mock
provider at 1,200 RPM over 10 s and 200 ms a call, the API, three workers with
--concurrency 2): two 2,000-line bulk jobs saturate the budget and the bulk slots
for 8 s, then a 10-line realtime job is timed from its creation to each line's answer.
"split" is compose.yml's layout (a worker of its own for `realtime`), "shared" has
every worker consume every queue with no slot kept for realtime (`--realtime-slots 0`,
the default before issue 30), "default" is three plain `quotaflow worker`s (every queue,
one thread of each kept for realtime). Uses the database quotaflow_bench (dropped and made
again) and Redis db 14, or QUOTAFLOW_BENCH_DATABASE_URL / QUOTAFLOW_BENCH_REDIS_URL.

    python -m bench.realtime_flood [--rounds 3]
"""

import argparse
import os
import platform
import statistics
import tempfile
from pathlib import Path

import redis

from quotaflow.db import upgrade
from tests.harness.realtime_flood import LATENCY_MS, LAYOUTS, FloodCluster, FloodResult
from tests.harness.servers import recreate_database

REDIS_URL = os.environ.get("QUOTAFLOW_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
PG_URL = os.environ.get("QUOTAFLOW_BENCH_DATABASE_URL",
                        "postgresql+psycopg://postgres@127.0.0.1:5432/quotaflow_bench")


def run(layout: str) -> FloodResult:
    recreate_database(PG_URL)
    upgrade(PG_URL)
    redis.Redis.from_url(REDIS_URL).flushdb()
    cluster = FloodCluster(Path(tempfile.mkdtemp(prefix="qf-flood-")), PG_URL, REDIS_URL,
                           layout)
    try:
        cluster.start()
        return cluster.run()
    finally:
        cluster.stop()
        redis.Redis.from_url(REDIS_URL).flushdb()


def _layout_text(layout: str) -> str:
    """('realtime', 'standard,bulk', 'standard,bulk') -> '1 x realtime, 2 x standard,bulk'."""
    queues = LAYOUTS[layout]
    kinds = dict.fromkeys(queues)
    text = ", ".join(f"{queues.count(kind)} x {kind}" for kind in kinds)
    return text + " + 1 rt slot" if layout == "default" else text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="Runs of each layout.")
    parser.add_argument("--layouts", default=",".join(LAYOUTS),
                        help="Comma-separated layouts to run (default: all).")
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"provider latency {LATENCY_MS} ms")
    print(f"{'layout':<8} {'workers (queues)':<44} {'p50 s':>6} {'p95 s':>6} "
          f"{'max s':>6} {'bulk answers/s':>15}")
    layouts = args.layouts.split(",")
    results: dict[str, list[FloodResult]] = {layout: [] for layout in layouts}
    for _ in range(args.rounds):
        for layout in layouts:
            result = run(layout)
            results[layout].append(result)
            _row(layout, layout, result.latencies, result.bulk_rate)
    if args.rounds > 1:  # one realtime job a round is one batch: compare over all rounds
        print(f"all {args.rounds} rounds:")
        for layout, found in results.items():
            _row(f"{layout}", layout, [s for r in found for s in r.latencies],
                 statistics.mean(r.bulk_rate for r in found))


def _row(label: str, layout: str, latencies: list[float], bulk_rate: float) -> None:
    summary = FloodResult(layout, latencies, 0, bulk_rate)
    print(f"{label:<8} {_layout_text(layout):<44} {summary.p50:>6.2f} {summary.p95:>6.2f} "
          f"{max(latencies):>6.2f} {bulk_rate:>15.1f}", flush=True)


if __name__ == "__main__":
    main()

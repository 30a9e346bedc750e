"""The long_ratio sweep: minutes against the lower bound, FIFO against size-aware.

For each share of long requests, a clustered file (shorts first) and a shuffled one run
on four workers against a strict mock provider at 2,400 RPM and a TPM that a half-long
file needs as much as RPM (tests/harness/long_ratio.py), once in line order
(QUOTAFLOW_ADMISSION_ORDER=fifo) and once size-aware (mixed, quotaflow/dispatch/mixing.py).
Prints, per run: seconds against the lower bound max(requests / RPM, tokens / TPM),
requests per minute, max(RPM use, TPM use) over the run, the p95 of short and of long
requests' answer times (from the job's first admission), and the provider's 429s.
Uses the database quotaflow_bench (dropped and made again) and Redis db 14, or
QUOTAFLOW_BENCH_DATABASE_URL / QUOTAFLOW_BENCH_REDIS_URL.

    python -m bench.long_ratio [--lines 600] [--ratios 0,0.3,0.5,0.65,0.9]
"""

import argparse
import os
import platform
import tempfile
from pathlib import Path

import redis

from quotaflow.db import upgrade
from tests.harness.long_ratio import LONG, RPM, SHORT, TPM, MixCluster, Run, job_lines
from tests.harness.servers import recreate_database

REDIS_URL = os.environ.get("QUOTAFLOW_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
PG_URL = os.environ.get("QUOTAFLOW_BENCH_DATABASE_URL",
                        "postgresql+psycopg://postgres@127.0.0.1:5432/quotaflow_bench")


def utilisation(lines: list[dict], seconds: float) -> float:
    """max(RPM use, TPM use) over the run: what share of the fuller-used limit it spent."""
    tokens = sum(sum(LONG if row["custom_id"][0] == "L" else SHORT) for row in lines)
    return max(len(lines) / (RPM / 60 * seconds), tokens / (TPM / 60 * seconds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=600)
    parser.add_argument("--ratios", default="0,0.3,0.5,0.65,0.9")
    args = parser.parse_args()
    ratios = [float(r) for r in args.ratios.split(",")]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; {args.lines} lines, "
          f"RPM {RPM}, TPM {TPM:,} (per second), short {sum(SHORT)} tokens, long {sum(LONG)}")
    print(f"{'long_ratio':>10} {'file':<9} {'order':<6} {'s':>6} {'bound s':>7} {'x bound':>7} "
          f"{'req/min':>8} {'max util':>8} {'p95 short':>9} {'p95 long':>8} {'429s':>5}")
    recreate_database(PG_URL)
    upgrade(PG_URL)
    for order in ("fifo", "mixed"):
        redis.Redis.from_url(REDIS_URL).flushdb()
        with MixCluster(Path(tempfile.mkdtemp(prefix="qf-mix-")), PG_URL, REDIS_URL,
                        order) as cluster:
            for ratio in ratios:
                for clustered in (True, False):
                    lines = job_lines(args.lines, ratio, clustered)
                    run: Run = cluster.run(lines)
                    print(f"{ratio:>10.2f} {'clustered' if clustered else 'shuffled':<9} "
                          f"{order:<6} {run.seconds:>6.1f} {run.lower_bound_s:>7.1f} "
                          f"{run.of_bound:>7.2f} {len(lines) / run.seconds * 60:>8.0f} "
                          f"{utilisation(lines, run.seconds):>8.2f} {run.short_p95_s:>9.1f} "
                          f"{run.long_p95_s:>8.1f} {run.rejected_429:>5}", flush=True)
    redis.Redis.from_url(REDIS_URL).flushdb()


if __name__ == "__main__":
    main()

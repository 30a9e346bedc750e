"""The limiter's soak (issue 28): N runs of each scenario of real workers against a strict
mock provider under adversity, and per scenario the runs, 429s (total and worst run),
utilisation of what the provider left to quotaflow (min / median), repeats and lost
requests. Scenarios: tests/harness/soak_cluster.py.

    python -m bench.limiter_soak                       # 20 runs of every scenario
    python -m bench.limiter_soak --runs 3 --scenario shared-key --scenario keeps-second

Needs PostgreSQL (QUOTAFLOW_BENCH_DATABASE_URL, a database of its own: it is emptied) and
redis-server on the PATH (the soak starts a Redis of its own, which it flushes and
restarts). Each run lasts some tens of seconds.
"""

import argparse
import os
import tempfile
import time
from pathlib import Path

from quotaflow.db import upgrade
from tests.harness.servers import recreate_database
from tests.harness.soak_cluster import SCENARIOS, SoakCluster, table

PG_URL = os.environ.get("QUOTAFLOW_BENCH_DATABASE_URL",
                        "postgresql+psycopg://postgres@127.0.0.1:5432/quotaflow_bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs of each scenario")
    parser.add_argument("--scenario", action="append", default=[],
                        choices=[s.name for s in SCENARIOS], help="only these (repeatable)")
    args = parser.parse_args()
    chosen = tuple(s for s in SCENARIOS if not args.scenario or s.name in args.scenario)
    recreate_database(PG_URL)
    upgrade(PG_URL)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, \
            SoakCluster(PG_URL, Path(tmp), chosen, args.runs) as cluster:
        results = []
        for soak, name in cluster.names():
            results.append(run := cluster.run(soak, name))
            print(f"{name}: {run.rejected_429} x 429, utilisation {run.utilisation:.3f}, "
                  f"{run.repeats} repeats, {run.lost} lost", flush=True)
    print(f"\n{args.runs} runs per scenario, {time.monotonic() - started:.0f} s in all\n")
    print(table(results))


if __name__ == "__main__":
    main()

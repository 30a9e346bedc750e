"""Fair shares between tenants, fair policy against FIFO; prints a table.

Each policy runs on a cluster of its own (tests/harness/fair_cluster.py: a strict mock provider
at 1,200 RPM enforced per second, 200 ms a call, the API, three workers with
--concurrency 2 on `standard,bulk`), through three scenarios in turn:

- equal:  A (weight 1) queues 800 lines, B (weight 1) 800 lines 4 s later;
- 3:1:    the same with A of weight 3;
- late:   A and B (weight 1) as in equal, C (weight 1) 20 lines 12 s in.

For each tenant: its weight, when it submitted (s after the scenario's first
submission), the lines admitted in the scenario's 24 s, its share of the requests the
two big tenants were admitted from 2 s after the later one submitted (all of that span,
then the lowest and highest over windows of 5 s, the issue's minutes scaled to the
per-second budget), and
its first answer after its submission. The strict provider's 429s are counted per
scenario. Uses the database quotaflow_bench (dropped and made again) and Redis db 14,
or QUOTAFLOW_BENCH_DATABASE_URL / QUOTAFLOW_BENCH_REDIS_URL.

    python -m bench.fair_share [--policy fair,fifo]
"""

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path

import redis

from quotaflow.db import upgrade
from tests.harness.fair_cluster import (
    LATENCY_MS,
    RPM,
    WINDOW_S,
    FairCluster,
    Submission,
    TenantRun,
    admitted_in,
)
from tests.harness.servers import recreate_database

REDIS_URL = os.environ.get("QUOTAFLOW_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
PG_URL = os.environ.get("QUOTAFLOW_BENCH_DATABASE_URL",
                        "postgresql+psycopg://postgres@127.0.0.1:5432/quotaflow_bench")
MEASURE_S = 24.0
SCENARIOS = {
    "equal": (Submission("a", 1, 800, 0.0), Submission("b", 1, 800, 4.0)),
    "3:1": (Submission("a", 3, 800, 0.0), Submission("b", 1, 800, 4.0)),
    "late": (Submission("a", 1, 800, 0.0), Submission("b", 1, 800, 4.0),
             Submission("c", 1, 20, 12.0)),
}


def spans_after_both_submitted(a: TenantRun, b: TenantRun) -> list[tuple[float, float]]:
    """Windows of WINDOW_S from the later submission (+2 s) to the first of the two
    tenants' last admissions (or the other's, where one was admitted nothing: FIFO)."""
    assert a.submitted is not None and b.submitted is not None
    start = max(a.submitted, b.submitted).timestamp() + 2.0
    end = min(run.admitted[-1] for run in (a, b) if run.admitted)
    return [(t, t + WINDOW_S) for t in (start + n * WINDOW_S for n in range(100))
            if t + WINDOW_S <= end]


def rows(scenario: str, policy: str, runs: list[TenantRun], rejected: int) -> list[str]:
    a, b = runs[0], runs[1]
    spans = spans_after_both_submitted(a, b)
    whole = (spans[0][0], spans[-1][1]) if spans else None
    first = runs[0].submitted
    out = []
    for run in runs:
        s = run.submission
        if whole and s.lines > 100:
            total = admitted_in(a, whole) + admitted_in(b, whole)
            shares = [admitted_in(run, span) / max(1, admitted_in(a, span) + admitted_in(b, span))
                      for span in spans]
            share = (f"{admitted_in(run, whole) / max(1, total):>6.3f} "
                     f"{min(shares):>6.3f}..{max(shares):<6.3f}")
        else:
            share = f"{'-':>6} {'-':>14}"
        first_s = run.first_answer_s
        at = (run.submitted - first).total_seconds() if run.submitted and first else 0.0
        out.append(f"{scenario:<6} {policy:<5} {s.tenant:<6} {s.weight:>6g} {at:>9.1f} "
                   f"{s.lines:>6} {len(run.admitted):>8} {share} "
                   f"{'never' if first_s is None else f'{first_s:.2f}':>9} {rejected:>5}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="fair,fifo")
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"provider {RPM} RPM enforced per second, latency {LATENCY_MS} ms; "
          f"{MEASURE_S:.0f} s per scenario")
    print(f"{'case':<6} {'policy':<5} {'tenant':<6} {'weight':>6} {'submit s':>9} "
          f"{'lines':>6} {'admitted':>8} {'share':>6} {'5 s windows':>14} "
          f"{'first s':>9} {'429s':>5}")
    for policy in args.policy.split(","):
        recreate_database(PG_URL)
        upgrade(PG_URL)
        redis.Redis.from_url(REDIS_URL).flushdb()
        cluster = FairCluster(Path(tempfile.mkdtemp(prefix="qf-fair-")), PG_URL, REDIS_URL,
                              fair=policy == "fair")
        try:
            cluster.start()
            for n, (name, submissions) in enumerate(SCENARIOS.items()):
                before = cluster.rejected_429()
                runs = cluster.run(submissions, MEASURE_S, tag=f"-{n}")
                for line in rows(name, policy, runs, cluster.rejected_429() - before):
                    print(line, flush=True)
                time.sleep(3.0)  # the cancelled jobs' last batches end
        finally:
            cluster.stop()
            redis.Redis.from_url(REDIS_URL).flushdb()


if __name__ == "__main__":
    main()

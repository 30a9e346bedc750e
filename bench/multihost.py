"""Across hosts, full length: the table of tests/cluster/test_multihost.py's scenarios at the sizes
issue 19 asks for, on four hosts in network namespaces (tests/harness/multihost_cluster.py).

    python -m bench.multihost                       # every scenario, about 7 minutes
    python -m bench.multihost --scenario exact --partition-s 30

Scenarios, one job each, in this order:

- exact: a job of about a minute of budget, 5-20 ms round trips between the hosts;
- B cut from Redis+PG: host B's proxy blocks Redis and PostgreSQL for --partition-s in
  the middle of a job (a third of it done), at the worst moment (one of B's
  transactions open: the cut is made and healed every half second until it catches
  one), then heals;
- B cut from provider: the same for the provider alone;
- clean (baseline) and loss 2%: the same job without and with 2% of segments lost on
  every link (the slowdown is the second's minutes over the first's);
- C 5 s ahead: host C's workers restarted under faketime, 5 s ahead, and a job.

Workers on default settings (the 30 s lease, renewed every 10 s), except the reaper,
which looks every second rather than every ten. Needs root, iproute2 and faketime, and
nothing else of the machine's: its PostgreSQL and Redis are its own, on host A.
"""

import argparse
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tests.harness.multihost_cluster import Budget, MultihostCluster
from tests.harness.multihost_jobs import Row, cut_b, in_turn, run_job, table

BUDGET = Budget(rpm=1200, burst_seconds=5, latency_ms=100)  # 20 requests a second
DELAY_MS = 4.0
SKEW_S = 5.0
MINUTE_LINES = 1300  # a full bucket (100) and a minute of refill (1,200)


def scenarios(cluster: MultihostCluster, partition_s: float
              ) -> dict[str, Callable[[], Row]]:
    lines = int(BUDGET.request_capacity + BUDGET.rpm / 60 * (partition_s * 2 + 30))

    def cut(routes: list[str], label: str) -> Callable[[], Row]:
        return lambda: run_job(cluster, label, lines, in_turn(cluster, cut_b(
            routes, partition_s, at=lines // 3, label=label,
            mid_transaction="postgres" in routes)))

    def lossy() -> Row:
        cluster.shape(loss=0.02)
        try:
            return run_job(cluster, "loss 2%", 600)
        finally:
            cluster.shape(loss=0.0)

    def skewed() -> Row:
        cluster.stop_workers("c")
        for worker in cluster.start_workers("c", SKEW_S):
            worker.wait_until(lambda w=worker: " ready." in w.log(), timeout=120)
        return run_job(cluster, f"C {SKEW_S:g} s ahead", 600)

    return {
        "exact": lambda: run_job(cluster, "exact", MINUTE_LINES),
        "B cut from Redis+PG": cut(["postgres", "redis"], "B cut from Redis+PG"),
        "B cut from provider": cut(["provider"], "B cut from provider"),
        "clean (baseline)": lambda: run_job(cluster, "clean (baseline)", 600),
        "loss 2%": lossy,
        "C 5 s ahead": skewed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", action="append", default=[],
                        help="run only this scenario (repeatable): exact, 'B cut from "
                             "Redis+PG', 'B cut from provider', 'clean (baseline)', "
                             "'loss 2%%', 'C 5 s ahead'")
    parser.add_argument("--partition-s", type=float, default=30.0)
    args = parser.parse_args()
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}; provider {BUDGET.rpm} RPM over "
          f"{BUDGET.burst_seconds:g} s, {BUDGET.latency_ms} ms a call; 4 workers x 2 slots "
          f"on hosts B and C", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="qf-bench-multihost-"))
    cluster = MultihostCluster(workdir, BUDGET, DELAY_MS, skew_s=0.0,
                               QUOTAFLOW_REAP_INTERVAL_S="1")
    rows: list[Row] = []
    started = time.monotonic()
    try:
        cluster.start()
        print(f"round trip B -> A (Redis PING through the proxy): "
              f"{cluster.round_trip_ms('b'):.1f} ms median", flush=True)
        for name, run in scenarios(cluster, args.partition_s).items():
            if args.scenario and name not in args.scenario:
                continue
            row = run()
            rows.append(row)
            notes = {k: v for k, v in row.notes.items() if k != "stats"}
            print(f"{name}: {row.status}, {row.lines} lines, reaped {row.reaped} times, "
                  f"peak in flight {row.notes['stats']['peak_in_flight']} {notes}", flush=True)
    finally:
        cluster.stop()
    print()
    print(table(rows))
    by_name = {row.scenario: row for row in rows}
    if "clean (baseline)" in by_name and "loss 2%" in by_name:
        ratio = by_name["loss 2%"].seconds / by_name["clean (baseline)"].seconds
        print(f"\nslowdown with 2% loss: {ratio:.2f}x the clean job's time")
    print(f"(the whole run: {(time.monotonic() - started) / 60:.1f} minutes; the processes' "
          f"logs are in {workdir})")


if __name__ == "__main__":
    main()

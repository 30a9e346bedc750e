"""Limiter benchmark: (a) acquire throughput against one local Redis, next to the
`limits` library's moving-window limiter and a bare EVALSHA of a no-op script (the
ceiling); (b) utilisation and 429s of the four-worker runs of tests/harness/limiter_cluster.py, at
providers that keep and that give back unused max_tokens; (c) a bulk job's throughput with
and without 5% of its requests refused 429 at random. Part (a) also times an acquire
under a tenant's cap (one more hash in the same Lua call).

    python -m bench.limiter            # all parts (about 7 minutes)
    python -m bench.limiter --part a   # acquire throughput only
    python -m bench.limiter --part b --scenario auto-second-keeps

Needs the local Redis and PostgreSQL that scripts/test sets up; uses Redis db 14
and a database of its own, quotaflow_bench.
"""

import argparse
import os
import platform
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import redis
from limits import RateLimitItemPerMinute
from limits.storage import RedisStorage
from limits.strategies import MovingWindowRateLimiter

from quotaflow.budget.buckets import RedisLimiter
from quotaflow.db import upgrade
from quotaflow.deployments.limits import Budget, Cap

REDIS_URL = os.environ.get("QUOTAFLOW_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
PG_URL = os.environ.get("QUOTAFLOW_BENCH_DATABASE_URL",
                        "postgresql+psycopg://postgres@127.0.0.1:5432/quotaflow_bench")
CALLS = 20_000


def per_second(call: Callable[[], object], calls: int = CALLS) -> float:
    for _ in range(500):  # warm the connection and the script cache
        call()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return calls / (time.perf_counter() - start)


def part_a() -> list[tuple[str, float]]:
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    noop = client.register_script("return 1")
    ours = RedisLimiter(REDIS_URL)
    # Limits so large nothing is ever refused: this measures the cost of a decision.
    budget = Budget(f"bench-{uuid.uuid4().hex[:6]}", 10**9, 10**12, 60)
    capped = budget.with_caps((Cap("tenant:bench", 10**9, 10**12),))
    window = MovingWindowRateLimiter(RedisStorage(REDIS_URL))
    item = RateLimitItemPerMinute(10**9)
    rows = [
        ("bare EVALSHA of a no-op script (ceiling)", per_second(lambda: noop(keys=["x"]))),
        ("quotaflow acquire (requests + tokens, Lua)",
         per_second(lambda: ours.acquire(budget, [100], 0.0))),
        ("quotaflow acquire under a tenant cap (Lua)",
         per_second(lambda: ours.acquire(capped, [100], 0.0))),
        ("limits MovingWindowRateLimiter.hit",
         per_second(lambda: window.hit(item, "bench"), calls=CALLS // 4)),
    ]
    client.flushdb()
    return rows


def run_scenarios(scenarios: tuple) -> list:
    from tests.harness.limiter_cluster import LimiterCluster
    from tests.harness.servers import recreate_database

    recreate_database(PG_URL)
    upgrade(PG_URL)
    with LimiterCluster(PG_URL, REDIS_URL, Path(tempfile.mkdtemp(prefix="qf-bench-")),
                        scenarios) as cluster:
        return [cluster.run(scenario) for scenario in scenarios]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["a", "b", "c", "all"], default="all")
    parser.add_argument("--scenario", action="append", default=[],
                        help="run only this scenario of part b or c (repeatable)")
    args = parser.parse_args()
    part = args.part
    from tests.harness.limiter_cluster import AUTO_SCENARIOS, FAULT_SCENARIOS, SCENARIOS

    def chosen(scenarios: tuple) -> tuple:
        return tuple(s for s in scenarios if not args.scenario or s.name in args.scenario)

    redis_version = redis.Redis.from_url(REDIS_URL).info()["redis_version"]
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, Redis {redis_version}")
    if part in ("a", "all"):
        rows = part_a()
        ceiling = rows[0][1]
        print("\n(a) decisions per second, one client, sequential")
        print(f"{'limiter':<46} {'ops/s':>10} {'of ceiling':>11}")
        for name, rate in rows:
            print(f"{name:<46} {rate:>10,.0f} {rate / ceiling:>10.0%}")
    if part in ("b", "all"):
        print("\n(b) 4 Celery workers x 2 slots, one deployment, strict mock provider")
        print(f"{'scenario':<20} {'queue':<8} {'latency':>7} {'burst s':>7} {'refunds':>7} "
              f"{'reconcile':>9} {'items':>6} {'seconds':>8} {'429s':>5} {'repeats':>7} "
              f"{'utilisation':>11} {'admitted/ceiling':>16}")
        for o in run_scenarios(chosen(SCENARIOS + AUTO_SCENARIOS)):
            s = o.scenario
            reconcile = "auto" if s.reconcile is None else str(s.reconcile)
            print(f"{s.name:<20} {s.queue:<8} {s.latency_ms:>5}ms {s.burst_seconds:>7g} "
                  f"{'yes' if s.provider_refunds else 'no':>7} {reconcile:>9} {o.items:>6} "
                  f"{o.seconds:>8.1f} {o.rejected_429:>5} {o.duplicate_bodies:>7} "
                  f"{o.utilisation:>11.3f} {o.admitted_vs_ceiling:>16.2f}")

    if part in ("c", "all"):
        print("\n(c) a bulk job, 4 workers, with and without 5% random 429s (no headers)")
        print(f"{'scenario':<12} {'items':>6} {'seconds':>8} {'429s':>5} {'req/s':>8} "
              f"{'of clean':>8}")
        clean = None
        for o in run_scenarios(chosen(FAULT_SCENARIOS)):
            rate = o.completed / o.seconds
            clean = clean or rate
            print(f"{o.scenario.name:<12} {o.items:>6} {o.seconds:>8.1f} "
                  f"{o.rejected_429 + o.faults_429:>5} {rate:>8.1f} {rate / clean:>8.0%}")


if __name__ == "__main__":
    main()

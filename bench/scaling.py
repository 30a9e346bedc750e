"""What one Redis and one PostgreSQL carry (docs/scaling.md): limiter acquisitions per second
and result writes per second at saturation, from P client processes at once.

    python -m bench.scaling                  # P = 1, 2, 4 (about a minute)
    python -m bench.scaling --clients 1,8
    python -m bench.scaling --redis-cluster  # acquisitions/s on 1 Redis, 1 and 3 masters

- acquisitions/s: each process calls RedisLimiter.acquire (one Lua call: both buckets,
  one deployment, limits nothing reaches) in a loop for --seconds; the sum of all.
- result writes/s: the processes claim 100-item batches of one shared job (leases.claim),
  as many workers on one large job do, and store their answers as the workers do, 16 at
  a time (leases.store_many: insert-or-ignore the results with their provenance, add
  them to the job's spend row, close the items: one transaction each); the sum of each
  process's results stored per second (the job's ingest is not counted); then the
  same with a job of its own per process, whose spend rows no other process takes.
  PostgreSQL keeps its defaults (fsync and synchronous_commit on).

- --redis-cluster: acquisitions/s only, against one plain Redis and Redis Clusters of
  1 and 3 masters (no replicas; tests/harness/redis_cluster.py, on --cluster-port and
  the 3 ports after it), each client with a budget of its own, the budgets spread evenly
  over the masters; with each master's CPU per acquisition. --fair-share: each
  acquisition after a fair-share ask, as workers do by default (all fair-share state is
  one hash tag, so on one master).

Both servers are throwaway ones of the benchmark's own (bench/e2e.py's), so the
machine's shared servers are never touched.
"""

import argparse
import io
import multiprocessing
import os
import platform
import shutil
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import NamedTuple

import redis

from bench.e2e import ThrowawayPostgres, ThrowawayRedis, _process_table, tree_cpu
from quotaflow.budget.buckets import RedisLimiter, bucket_key
from quotaflow.budget.fair_share import RedisFairShare
from quotaflow.config import Settings
from quotaflow.db import session_factory, upgrade
from quotaflow.deployments.limits import Budget
from quotaflow.dispatch.queues import BatchRef
from quotaflow.ingest import pipeline
from quotaflow.providers.base import ProviderResponse
from quotaflow.providers.outcomes import Provenance
from quotaflow.results.leases import claim, store_many
from quotaflow.tenants.spend import Billing
from tests.harness.redis_cluster import RedisClusterServers

CHUNK = 16  # a worker stores a batch's answers a chunk at a time
BATCH = 100
JOB_LINES = 50_000


class _NoDispatch:
    def dispatch(self, queue: str, batches: list[BatchRef]) -> None:
        """Nothing runs the batches: the benchmark claims them itself."""


def _acquire(url: str, seconds: float, out: "multiprocessing.Queue[float]",
             name: str = "bench-scaling", fair: bool = False) -> None:
    """Acquire in a loop; `fair`: ask the tenant's fair share first, as a worker does
    before each acquisition when QUOTAFLOW_FAIR_SHARE is on (the default)."""
    limiter = RedisLimiter(url)
    shares = RedisFairShare(url) if fair else None
    budget = Budget(name, 10**9, 10**12, 60)
    calls, started = 0, time.monotonic()
    while time.monotonic() < started + seconds:
        if shares is not None:
            shares.ask(budget, "bench", 1.0, 0.0)
        limiter.acquire(budget, [100], 0.0)
        calls += 1
    out.put(calls / (time.monotonic() - started))


def make_job(url: str, lines: int) -> str:
    """A job of `lines` distinct requests, stored and never dispatched."""
    sessions = session_factory(url)
    settings = Settings(database_url=url, broker_url="redis://unused", batch_size=BATCH,
                        _env_file=None)
    data = "".join(f'{{"custom_id": "r{i}", "method": "POST", "url": "/v1/chat/completions", '
                   f'"body": {{"model": "m", "messages": [{{"role": "user", "content": '
                   f'"question {i}"}}]}}}}\n' for i in range(lines)).encode()
    return pipeline.create_job_in_process(
        sessions, io.BytesIO(data), settings=settings, deployments=settings.load_deployments(),
        dispatcher=_NoDispatch(), queue="bulk").id


def _write(url: str, seconds: float, out: "multiprocessing.Queue[float]", job_id: str,
           index: int, clients: int) -> None:
    """Store answers of every `clients`-th batch of the shared job, from `index` on."""
    sessions = session_factory(url)
    billing = Billing("default", {"m": None})
    answer = {"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": {
        "role": "assistant", "content": "an answer of a few words"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 6, "total_tokens": 18}}
    stored, first, started = 0, index * BATCH, time.monotonic()
    while time.monotonic() < started + seconds and first < JOB_LINES:
        items = claim(sessions, BatchRef(job_id, first, first + BATCH - 1), uuid.uuid4().hex,
                      timedelta(seconds=30))
        first += BATCH * clients
        for i in range(0, len(items), CHUNK):
            chunk = items[i:i + CHUNK]
            now = time.time()
            store_many(sessions, job_id,
                       [(item, ProviderResponse(200, answer, "req", 12, 6)) for item in chunk],
                       provenance=[Provenance("m", 1, now, now, now)] * len(chunk),
                       on_stored=billing.stored)
            stored += len(chunk)
    out.put(stored / (time.monotonic() - started))


class Rate(NamedTuple):
    per_s: float  # the sum of the clients' rates
    server_ms: float  # the server's CPU per operation, its whole process tree

    def cell(self) -> str:
        return f"{self.per_s:,.0f} ({self.server_ms:.3f})"


def saturate(target: object, url: str, clients: int, seconds: float, server: int,
             jobs_of: list[str] | None = None) -> Rate:
    """The sum of `clients` processes' rates, each over its own timed loop, and the CPU
    the `server` pid's tree spent per operation meanwhile (a figure the machine's other
    load leaves alone, unlike the rate); `jobs_of`: the job each writes to (one shared
    job: they take its batches in turn)."""
    cpu_before = tree_cpu([server], _process_table())
    out: multiprocessing.Queue[float] = multiprocessing.Queue()
    shared = jobs_of is not None and len(set(jobs_of)) == 1

    def extra(n: int) -> tuple:
        if jobs_of is None:
            return ()
        return (jobs_of[n], n, clients) if shared else (jobs_of[n], 0, 1)

    procs = [multiprocessing.Process(target=target, args=(url, seconds, out, *extra(n)))
             for n in range(clients)]
    for proc in procs:
        proc.start()
    total = sum(out.get(timeout=seconds + 300) for _ in procs)
    for proc in procs:
        proc.join()
    cpu = tree_cpu([server], _process_table()) - cpu_before
    return Rate(total, 1000 * cpu / (total * seconds))  # each client ran `seconds`


def saturate_masters(url: str, names: list[str], seconds: float, pids: list[int],
                     fair: bool = False) -> tuple[float, list[float]]:
    """The sum of one client process per budget in `names` acquiring for `seconds`, and
    each of the `pids` (a cluster's masters) CPU-ms per acquisition of all the clients:
    the busiest master is the ceiling."""
    before = _process_table()
    out: multiprocessing.Queue[float] = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=_acquire, args=(url, seconds, out, name, fair))
             for name in names]
    for proc in procs:
        proc.start()
    total = sum(out.get(timeout=seconds + 300) for _ in procs)
    for proc in procs:
        proc.join()
    after = _process_table()
    return total, [1000 * (tree_cpu([pid], after) - tree_cpu([pid], before))
                   / (total * seconds) for pid in pids]


def spread(servers: RedisClusterServers, count: int) -> list[str]:
    """`count` budget names, dealt over the cluster's masters in turn."""
    masters, names, n = servers.master_ports(), [], 0
    while len(names) < count:
        name = f"bench-{n}"
        if servers.master_of(bucket_key(name)) == masters[len(names) % len(masters)]:
            names.append(name)
        n += 1
    return names


def cluster_main(clients: list[int], seconds: float, first_port: int, workdir: Path,
                 fair: bool = False) -> None:
    """All three servers up at once and measured in turn for each number of clients, so
    that the machine's other load, which drifts, falls on each alike."""
    redis_server = ThrowawayRedis(workdir)
    clusters = [RedisClusterServers(workdir / "one", first_port, 1, replicas=0),
                RedisClusterServers(workdir / "three", first_port + 1, 3, replicas=0)]
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, Redis {redis_server.version}, redis-py "
          f"{redis.__version__}; clients and servers share the machine")
    print("acquisitions per second, summed over the clients, each on a budget of its own"
          f"{', each after a fair-share ask' if fair else ''} (each master's CPU-ms per "
          "acquisition)")
    print(f"{'clients':>7} {'one Redis':>18} {'cluster, 1 master':>22} "
          f"{'cluster, 3 masters':>32}")
    try:
        for cluster in clusters:
            cluster.start()
        for n in clients:
            rate, (ms,) = saturate_masters(redis_server.url, [f"bench-{i}" for i in range(n)],
                                           seconds, [redis_server.popen.pid], fair)
            cells = [f"{rate:,.0f} ({ms:.3f})"]
            for cluster in clusters:
                pids = [cluster.procs[port].pid for port in cluster.master_ports()]
                rate, each = saturate_masters(cluster.url, spread(cluster, n), seconds, pids,
                                              fair)
                cells.append(f"{rate:,.0f} ({' / '.join(f'{m:.3f}' for m in each)})")
            print(f"{n:>7} {cells[0]:>18} {cells[1]:>22} {cells[2]:>32}", flush=True)
    finally:
        redis_server.stop()
        for cluster in clusters:
            cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="1,2,4")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--redis-cluster", action="store_true",
                        help="acquisitions/s on one Redis and on clusters of 1 and 3 masters")
    parser.add_argument("--cluster-port", type=int, default=7100,
                        help="the first of the clusters' ports (4 in use; bus ports +10000)")
    parser.add_argument("--fair-share", action="store_true",
                        help="with --redis-cluster: ask the fair share before each acquisition")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="qf-bench-scaling-"))
    if args.redis_cluster:
        try:
            cluster_main([int(n) for n in args.clients.split(",")], args.seconds,
                         args.cluster_port, workdir, args.fair_share)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        return
    redis_server, postgres = ThrowawayRedis(workdir), ThrowawayPostgres([])
    try:
        pg_url = postgres.start()
        upgrade(pg_url)
        print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
              f"Python {platform.python_version()}, Redis {redis_server.version}; the "
              "clients share the machine with the servers")
        print("per second, summed over the clients (the server's CPU-ms per operation)")
        print(f"{'clients':>7} {'acquisitions':>18} {'writes, one job':>18} "
              f"{'writes, own jobs':>18}")
        for clients in (int(n) for n in args.clients.split(",")):
            acquired = saturate(_acquire, redis_server.url, clients, args.seconds,
                                redis_server.popen.pid)
            shared = saturate(_write, pg_url, clients, args.seconds, postgres.pid,
                              [make_job(pg_url, JOB_LINES)] * clients)
            own = saturate(_write, pg_url, clients, args.seconds, postgres.pid,
                           [make_job(pg_url, JOB_LINES) for _ in range(clients)])
            print(f"{clients:>7} {acquired.cell():>18} {shared.cell():>18} {own.cell():>18}",
                  flush=True)
    finally:
        redis_server.stop()
        postgres.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()

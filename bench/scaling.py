"""What one Redis and one PostgreSQL carry (docs/scaling.md): limiter acquisitions per second
and result writes per second at saturation, from P client processes at once.

    python -m bench.scaling                  # P = 1, 2, 4 (about a minute)
    python -m bench.scaling --clients 1,8

- acquisitions/s: each process calls RedisLimiter.acquire (one Lua call: both buckets,
  one deployment, limits nothing reaches) in a loop for --seconds; the sum of all.
- result writes/s: each process claims 100-item batches of a job of its own
  (leases.claim) and stores their answers as the workers do, 16 at a time
  (leases.store_many: insert-or-ignore the results, close the items, one transaction
  each); the sum of each process's results stored per second, its job's ingest not
  counted. PostgreSQL keeps its
  defaults (fsync and synchronous_commit on).

Both servers are throwaway ones of the benchmark's own (bench/e2e.py's), so the
machine's shared servers are never touched.
"""

import argparse
import io
import multiprocessing
import os
import platform
import tempfile
import time
import uuid
from datetime import timedelta
from pathlib import Path

from bench.e2e import ThrowawayPostgres, ThrowawayRedis
from quotaflow import jobs
from quotaflow.config import Settings
from quotaflow.db import session_factory, upgrade
from quotaflow.dispatch import BatchRef
from quotaflow.leases import claim, store_many
from quotaflow.limiters import RedisLimiter
from quotaflow.providers.base import ProviderResponse
from quotaflow.ratelimit import Budget

CHUNK = 16  # a worker stores a batch's answers a chunk at a time
BATCH = 100


class _NoDispatch:
    def dispatch(self, queue: str, batches: list[BatchRef]) -> None:
        """Nothing runs the batches: the benchmark claims them itself."""


def _acquire(url: str, seconds: float, out: "multiprocessing.Queue[float]") -> None:
    limiter = RedisLimiter(url)
    budget = Budget("bench-scaling", 10**9, 10**12, 60)
    calls, started = 0, time.monotonic()
    while time.monotonic() < started + seconds:
        limiter.acquire(budget, [100], 0.0)
        calls += 1
    out.put(calls / (time.monotonic() - started))


def _write(url: str, seconds: float, out: "multiprocessing.Queue[float]") -> None:
    sessions = session_factory(url)
    settings = Settings(database_url=url, broker_url="redis://unused", batch_size=BATCH,
                        _env_file=None)
    lines = 10_000
    data = "".join(f'{{"custom_id": "r{i}", "method": "POST", "url": "/v1/chat/completions", '
                   f'"body": {{"model": "m", "messages": [{{"role": "user", "content": '
                   f'"question {i}"}}]}}}}\n' for i in range(lines)).encode()
    job = jobs.create_job(sessions, io.BytesIO(data), settings=settings,
                          deployments=settings.load_deployments(), dispatcher=_NoDispatch(),
                          queue="bulk")
    answer = {"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": {
        "role": "assistant", "content": "an answer of a few words"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 6, "total_tokens": 18}}
    stored, first, started = 0, 0, time.monotonic()
    while time.monotonic() < started + seconds and first < lines:
        items = claim(sessions, BatchRef(job.id, first, first + BATCH - 1), uuid.uuid4().hex,
                      timedelta(seconds=30))
        first += BATCH
        for i in range(0, len(items), CHUNK):
            chunk = items[i:i + CHUNK]
            store_many(sessions, job.id, [(item, ProviderResponse(200, answer, "req", 12, 6))
                                         for item in chunk])
            stored += len(chunk)
    out.put(stored / (time.monotonic() - started))


def saturate(target: object, url: str, clients: int, seconds: float) -> float:
    """The sum of `clients` processes' rates, each over its own timed loop."""
    out: multiprocessing.Queue[float] = multiprocessing.Queue()
    procs = [multiprocessing.Process(target=target, args=(url, seconds, out))
             for _ in range(clients)]
    for proc in procs:
        proc.start()
    total = sum(out.get(timeout=seconds + 300) for _ in procs)
    for proc in procs:
        proc.join()
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="1,2,4")
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="qf-bench-scaling-"))
    redis_server, postgres = ThrowawayRedis(workdir), ThrowawayPostgres([])
    try:
        pg_url = postgres.start()
        upgrade(pg_url)
        print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
              f"Python {platform.python_version()}, Redis {redis_server.version}; the "
              "clients share the machine with the servers")
        print(f"{'clients':>7} {'acquisitions/s':>15} {'result writes/s':>16}")
        for clients in (int(n) for n in args.clients.split(",")):
            acquired = saturate(_acquire, redis_server.url, clients, args.seconds)
            written = saturate(_write, pg_url, clients, args.seconds)
            print(f"{clients:>7} {acquired:>15,.0f} {written:>16,.0f}", flush=True)
    finally:
        redis_server.stop()
        postgres.stop()


if __name__ == "__main__":
    main()

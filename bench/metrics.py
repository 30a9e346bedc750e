"""What the metrics cost a worker per request, measured in one process without noise.

    python -m bench.metrics

Runs in prometheus_client's multiprocess mode (a temporary PROMETHEUS_MULTIPROC_DIR,
as `quotaflow worker --metrics-port` sets it) and times, per request, what the
execution loop records: one answered call, an admission per chunk of 16, and a flush
every 64 calls (quotaflow/observe/metrics.py's Tally), against the same work writing each
sample to the metrics directly (observe() and inc() per request). Then the cost of a
scrape that sums the files of two pool processes.
"""

import os
import tempfile
import time

# prometheus_client reads the variable when it is first imported.
os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="qf-bench-metrics-")

from prometheus_client import CollectorRegistry, generate_latest, multiprocess

from quotaflow.observe import metrics

CALLS = 200_000
CHUNK = 16
FLUSH_EVERY = 64


def tallied() -> float:
    tally = metrics.Tally("standard")
    started = time.perf_counter()
    for n in range(CALLS):
        if n % CHUNK == 0:
            tally.admitted("bench", CHUNK, CHUNK * 120, 0.003)
        tally.answered("bench", "200", 0.021, 100, 8)
        if n % FLUSH_EVERY == FLUSH_EVERY - 1:
            tally.flush()
    tally.flush()
    return (time.perf_counter() - started) / CALLS


def direct() -> float:
    responses = metrics.PROVIDER_RESPONSES.labels("direct", "200")
    latency = metrics.PROVIDER_LATENCY.labels("direct")
    prompt = metrics.PROVIDER_TOKENS.labels("direct", "prompt")
    completion = metrics.PROVIDER_TOKENS.labels("direct", "completion")
    started = time.perf_counter()
    for _ in range(CALLS):
        responses.inc()
        latency.observe(0.021)
        prompt.inc(100)
        completion.inc(8)
    return (time.perf_counter() - started) / CALLS


def scrape() -> float:
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    started = time.perf_counter()
    for _ in range(100):
        generate_latest(registry)
    return (time.perf_counter() - started) / 100


def main() -> None:
    print(f"tallied, per request:        {tallied() * 1e6:6.2f} us")
    print(f"written directly, per call:  {direct() * 1e6:6.2f} us (provider metrics only)")
    print(f"one scrape of the files:     {scrape() * 1e3:6.2f} ms")


if __name__ == "__main__":
    main()

"""Realtime stays fast under a bulk flood (issue 18, part 3; issue 30, part 6): with bulk
jobs saturating the budget and every bulk worker slot, a 10-line realtime job's lines
are answered within 2 s plus the provider's latency (p95), in the layout compose.yml
ships (a worker of its own for the realtime queue) and with plain `quotaflow worker`s,
each of which keeps a slot for realtime (cli/worker_group.py;
tests/harness/realtime_flood.py).

With workers that all consume every queue and keep no slot (the "shared" layout of
bench/realtime_flood.py, `--realtime-slots 0`), the same job's p95 was 10-20 s and
these tests fail."""

from pathlib import Path

import pytest

from tests.harness.realtime_flood import LATENCY_MS, REALTIME_LINES, FloodCluster
from tests.harness.servers import REDIS_URL, flush_redis

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("layout", ["split", "default"])
def test_a_realtime_job_is_answered_within_two_seconds_through_a_bulk_flood(
        pg_url: str, tmp_path: Path, layout: str) -> None:
    flush_redis(REDIS_URL)
    cluster = FloodCluster(tmp_path, pg_url, REDIS_URL, layout)
    try:
        cluster.start()
        result = cluster.run()
    finally:
        cluster.stop()
    print(f"realtime p50 {result.p50:.2f} s, p95 {result.p95:.2f} s; bulk "
          f"{result.bulk_rate:.1f} answers/s meanwhile, {result.bulk_done_before} before")
    assert len(result.latencies) == REALTIME_LINES
    # The flood was on: bulk had been answered for seconds, and went on meanwhile.
    assert result.bulk_done_before > 50 and result.bulk_rate > 5
    assert result.p95 < 2.0 + LATENCY_MS / 1000, result.latencies
    if layout == "default":
        # the mechanism: the realtime job's one batch ran on a worker's realtime slot
        # (Celery's count of the slots' tasks went up by one), while bulk held the pools
        assert result.slot_batches == 1, result

"""Fair shares between tenants (issue 18, part 2), on a real cluster: three Celery
workers, the strict mock provider at 20 requests a second enforced per second, real
Redis and PostgreSQL (tests/harness/fair_cluster.py).

Tenant A (weight 3) queues a big bulk job first, B (weight 1) one 3 s later, C (weight
1) a small one 14 s in. Once both run, A's share of what A and B are admitted stays
within 10% of 3 / (3 + 1) over every 5 s window (the issue's minutes, scaled to a
per-second budget), and C's first answer comes within a few seconds of its
submission. The strict provider still answers no 429.

With the policy replaced by FIFO (QUOTAFLOW_FAIR_SHARE=false, the test's
`fair=False`), A's queued batches take every worker and the whole budget: B and C are
admitted nothing until A ends, and this test fails.
"""

from pathlib import Path

import pytest

from tests.harness.fair_cluster import FairCluster, Submission, window_shares
from tests.harness.servers import REDIS_URL, flush_redis

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

SUBMISSIONS = (Submission("fa", 3, 800, 0.0), Submission("fb", 1, 800, 3.0),
               Submission("fc", 1, 20, 14.0))


def test_tenants_share_a_deployment_by_weight_and_a_late_small_job_starts_at_once(
        pg_url: str, tmp_path: Path) -> None:
    flush_redis(REDIS_URL)
    cluster = FairCluster(tmp_path, pg_url, REDIS_URL)
    try:
        cluster.start()
        a, b, c = cluster.run(SUBMISSIONS, measure_s=26.0)
        rejected = cluster.rejected_429()
    finally:
        cluster.stop()
    shares = window_shares(a, b)
    print(f"A's share per 5 s window: {[round(s, 3) for s in shares]}; "
          f"C's first answer {c.first_answer_s} s; 429s {rejected}")
    assert rejected == 0
    assert len(shares) >= 2, (len(a.admitted), len(b.admitted))
    assert all(abs(share - 0.75) <= 0.075 for share in shares), shares
    assert c.first_answer_s is not None and c.first_answer_s < 5.0, c.first_answer_s

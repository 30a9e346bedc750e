"""The soak's short form (bench/limiter_soak.py has the full table): one short run of the
scenarios that broke the budget before issue 28, asserting its goals. Where quotaflow is
the key's only user: 0 x 429, nothing repeated or lost. With a second client on the key:
429s at most one burst (a batch run's max_concurrency), and at least 0.95 of what the
other left.
"""

import dataclasses
from pathlib import Path

import pytest

from tests.harness.soak_cluster import MAX_CONCURRENCY, SCENARIOS, SoakCluster

pytestmark = pytest.mark.timeout(600)

SHORT = tuple(dataclasses.replace(soak, seconds=min(soak.seconds, 10.0)) for soak in SCENARIOS
              if soak.name in ("refunds-second", "starved-cpu", "shared-key", "redis-flushed"))


def test_the_budget_stays_exact_under_adversity(pg_url: str, pg_sessions,
                                                tmp_path: Path) -> None:
    with SoakCluster(pg_url, tmp_path, SHORT, runs=1) as cluster:
        results = cluster.run_all()
    for run in results:
        name = run.soak.name
        assert run.lost == 0 and run.repeats == 0, (name, run)
        if run.soak.other[1]:
            assert run.rejected_429 <= MAX_CONCURRENCY, (name, run)
            assert run.utilisation >= 0.95, (name, run)
        else:
            assert run.rejected_429 == 0, (name, run)
        if not run.soak.redis:  # a lost budget restarts empty: it gives some away
            assert run.utilisation >= 0.9, (name, run)

"""Size-aware dispatch packs RPM and TPM together (issue 18, part 1): a clustered file
(its 300 short requests first, then 300 long ones) on four workers against a strict
provider whose RPM and TPM that file needs alike (tests/harness/long_ratio.py).

In line order ("fifo") the shorts spend RPM with TPM to spare, then the longs spend
TPM with RPM to spare: about 1.45 x the lower bound max(requests / RPM, tokens / TPM).
Mixed (quotaflow/dispatch/mixing.py, the default) must come within 10% of the bound (5% in
bench/long_ratio.py's longer runs), with no more 429s and the long requests' p95 no
later than in line order. The fifo run is the control: it shows the file is one that
line order cannot pack."""

from pathlib import Path

import pytest

from tests.harness.long_ratio import MixCluster, job_lines
from tests.harness.servers import REDIS_URL, flush_redis

pytestmark = pytest.mark.timeout(300)


def test_mixed_order_ends_near_the_lower_bound_where_line_order_cannot(
        pg_url: str, tmp_path: Path) -> None:
    lines = job_lines(600, long_ratio=0.5, clustered=True)
    runs = {}
    for order in ("fifo", "mixed"):
        flush_redis(REDIS_URL)
        (tmp_path / order).mkdir()
        with MixCluster(tmp_path / order, pg_url, REDIS_URL, order) as cluster:
            runs[order] = cluster.run(lines)
        print(f"{order}: {runs[order]}")
    fifo, mixed = runs["fifo"], runs["mixed"]
    assert fifo.of_bound > 1.25, fifo  # the control: line order cannot pack this file
    assert mixed.of_bound < 1.10, mixed
    assert mixed.long_p95_s <= fifo.long_p95_s, (mixed, fifo)
    assert mixed.rejected_429 == fifo.rejected_429 == 0

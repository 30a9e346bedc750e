"""Across machines: four hosts in network namespaces, 5-20 ms round trips between them,
partitions, packet loss, and a worker host whose clock runs 5 s ahead.

Host A holds PostgreSQL, Redis and the API; B and C two workers each; D the strict mock
provider (tests/harness/multihost_cluster.py). The cluster is started once for the module, and
host C's workers run 5 s ahead for all of it, so every job here is also the clock-skew
proof: the limiter (Redis's clock), the leases and the reaper (which runs, every second,
on whichever worker takes its lock) must hold with it. The jobs are short; the full-length
versions (a one-minute exactness job, a 30 s partition) are bench/multihost.py's.
"""

import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import func, select

from quotaflow.models import Item, ItemStatus
from tests.harness.multihost_cluster import Budget, MultihostCluster
from tests.harness.multihost_jobs import ROWS, Row, cut_b, in_turn, run_job, table, wait_for_results
from tests.harness.netns import NetnsUnavailable, check_available

pytestmark = [pytest.mark.multihost, pytest.mark.cluster, pytest.mark.timeout(420)]

BUDGET = Budget(rpm=1200, burst_seconds=5, latency_ms=100)  # 20 requests a second
DELAY_MS = 4.0  # one way, each direction: about 10 ms a round trip with the proxy's time
SKEW_S = 5.0
# Twice the default lease (renewed every 20 s): the partition test's cuts (up to a renewal
# beat since B's last renewal, the search for the worst moment, then a 16 s cut) must end
# inside one lease, or the reaper rightly gives B's items to C and what B had in flight
# is sent again (docs/operations/reliability.md). With 30 s that left the search 4 s, and
# CI once saw 10 bodies sent twice; with 60 s it has 24.
LEASE_S = 60
IDLE_IN_TRANSACTION_S = 3  # quicker than the default 10 s, to fit a 10 s partition
# B's pool processes (2 workers x 2), each a session that may hold the spend row for
# IDLE_IN_TRANSACTION_S in turn once B is cut, and 4 s more for host C to show it goes on.
B_CUT_S = 4 * IDLE_IN_TRANSACTION_S + 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultihostCluster]:
    try:
        check_available()
    except NetnsUnavailable as exc:
        pytest.skip(f"multi-host tests need network namespaces: {exc}")
    cluster = MultihostCluster(tmp_path_factory.mktemp("multihost"), BUDGET, DELAY_MS, SKEW_S,
                               QUOTAFLOW_REAP_INTERVAL_S="1",
                               QUOTAFLOW_LEASE_S=str(LEASE_S),
                               QUOTAFLOW_WORKER_IDLE_IN_TRANSACTION_S=str(IDLE_IN_TRANSACTION_S))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _check(row: Row) -> None:
    ROWS.append(row)
    print(table(ROWS), row.notes)
    assert row.status == "completed", row
    assert row.lost == 0, row
    assert row.duplicated_results == 0, row
    assert row.sent_twice == 0, row.notes["stats"]


def _skewed_leases(cluster: MultihostCluster) -> float:
    """The longest lease left on a running item, by the database's clock: over LEASE_S
    only for a claim made on a clock that runs ahead (host C's)."""
    with cluster.sessions()() as session:
        left = session.scalar(select(func.max(Item.lease_expires_at - func.now()))
                              .where(Item.status == ItemStatus.RUNNING))
    return (left or timedelta()).total_seconds()


def test_the_limiter_is_exact_across_hosts_with_delays_and_a_clock_ahead(
        cluster: MultihostCluster) -> None:
    # Given 5-20 ms round trips from the workers' hosts to Redis, PostgreSQL and the provider
    rtt = cluster.round_trip_ms("b")
    assert 2 * DELAY_MS <= rtt <= 40, rtt

    # When a job that needs about 30 s of budget runs on four workers on two hosts
    def watch_leases(job_id: str, notes: dict[str, object]) -> None:
        wait_for_results(cluster, job_id, 100)
        seen = []
        for _ in range(20):
            seen.append(_skewed_leases(cluster))
            time.sleep(0.25)
        notes["longest lease left (s)"] = max(seen)

    row = run_job(cluster, "exact", 700, watch_leases)
    row.notes["round trip (ms)"] = round(rtt, 1)
    # Then the strict provider refused nothing, and the budget was used to the full
    _check(row)
    assert row.rejected_429 == 0, row.notes["stats"]
    # (0.97 holds for the minute-long job of bench/multihost.py: 0.992; a 30 s job loses
    # relatively more to its start and end)
    assert row.of_max >= 0.95, row
    # And host C's claims were made on its clock, 5 s ahead, yet no live lease was taken
    # for a dead worker's: the reaper queued nothing again
    assert row.notes["longest lease left (s)"] > LEASE_S + 1, row.notes
    assert row.reaped == 0, row


def test_partitions_of_a_worker_host_lose_nothing_and_send_nothing_twice(
        cluster: MultihostCluster) -> None:
    # Given a job of about 70 s on both worker hosts: room for the search for the worst
    # moment below (cuts of up to 2 s until one catches B mid-transaction), which took 18
    # cuts (43 s) in a CI run under load and ran a 40 s job out of work before its cut
    # When host B is cut off from Redis and PostgreSQL for 16 s, at the worst moment: in
    # the middle of one of its transactions; then, once healed and the job has moved on,
    # from the provider for 10 s
    row = run_job(cluster, "partitions", 1400, in_turn(
        cluster,
        cut_b(["postgres", "redis"], B_CUT_S, at=150, label="B cut from Redis and PostgreSQL",
              mid_transaction=True),
        cut_b(["provider"], 10, at=450, label="B cut from the provider")))
    # Then every custom_id came back once, no request reached the provider twice, and the
    # budget was never exceeded, while B was cut off or after: the job finished by itself
    _check(row)
    assert row.rejected_429 == 0, row.notes
    assert row.notes["429s while B cut from Redis and PostgreSQL"] == 0, row.notes
    assert row.notes["cuts until one caught B mid-transaction (B cut from Redis and "
                     "PostgreSQL)"] is not None, row.notes
    # And host C carried on meanwhile: B's open transaction was ended by PostgreSQL after
    # IDLE_IN_TRANSACTION_S, not left to hold the job's spend row (and every other
    # worker's writes) until B came back. B's other sessions may be queued on that row
    # when the cut comes: each then takes it, cannot commit, and holds it for
    # IDLE_IN_TRANSACTION_S in turn (CI once saw no result in a 10 s cut), so the cut
    # outlasts all of them (B_CUT_S); at 20 requests a second, 2 s of C's make 40
    assert row.notes["results while B cut from Redis and PostgreSQL"] >= 40, row.notes
    # (cut from the provider, B's calls hold their admissions until they time out, and
    # the lines of B's claimed batches wait for B to hand them back: what C can claim
    # meanwhile depends on how the batches fell, and CI once saw 15. Held up behind B, C
    # would store none; 10, half a second of the budget, shows it carried on)
    assert row.notes["results while B cut from the provider"] >= 10, row.notes


def test_two_percent_packet_loss_on_every_link_slows_the_job_but_loses_nothing(
        cluster: MultihostCluster) -> None:
    baseline = next((row for row in ROWS if row.scenario == "exact"), None)
    cluster.shape(loss=0.02)
    try:
        row = run_job(cluster, "loss 2%", 300)
    finally:
        cluster.shape(loss=0.0)
    lost = {host: cluster.control(host)["segments_lost"] for host in ("b", "c")}
    row.notes["segments lost"] = lost
    if baseline is not None:
        row.notes["slowdown"] = round((row.seconds / row.lines)
                                      / (baseline.seconds / baseline.lines), 2)
    _check(row)
    assert sum(lost.values()) > 0


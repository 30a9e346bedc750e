"""The limiter on a real Redis Cluster (3 masters, 3 replicas, on loopback): four
workers share two budgets that live on different masters, at strict providers, and
the master of one budget is SIGKILLed mid-run. Its replica takes over; nothing is
lost, nothing is sent twice, and the 429s are counted.

What holds with today's code, and is asserted: the replica had the budget's hash
(replication on loopback outruns the kill), so the budget carries on where it was and
the provider refuses nothing (0 x 429). What depends on issue 28's part 4 ("fail safe
on lost state"): a replica that missed the last writes holds a hash that is neither
missing nor from another broker run, only older, and its bucket is fuller than the
provider's by what it missed; a master and replica both lost would recreate the hash
full. Neither happens here.
"""

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from quotaflow.budget.buckets import RedisLimiter, bucket_key
from quotaflow.deployments.limits import Budget
from quotaflow.errors import ServiceUnavailable
from tests.harness.limiter_cluster import LimiterCluster, Scenario
from tests.harness.redis_cluster import RedisClusterServers
from tests.harness.servers import REDIS_URL, redis_keys

FIRST_PORT = int(os.environ.get("QUOTAFLOW_TEST_REDIS_CLUSTER_PORT", "7100"))


def scenario(name: str, queue: str) -> Scenario:
    """20 requests a second after a 10 s burst (200, less the queue's floor): about 600
    requests, 30 s of budget. The two jobs go to two queues, which workers take from in
    turn: on one queue the second would start when the first had been admitted."""
    return Scenario(name, rpm=1_200, tpm=10_000_000, burst_seconds=10, max_tokens=50,
                    provider_refunds=False, reconcile=False, target_seconds=20, queue=queue)


def on_two_masters(servers: RedisClusterServers) -> tuple[Scenario, Scenario]:
    """Two deployments whose budgets hash to slots of different masters."""
    first = "failover-0"
    for n in range(1, 100):
        second = f"failover-{n}"
        if servers.master_of(bucket_key(second)) != servers.master_of(bucket_key(first)):
            return scenario(first, "standard"), scenario(second, "realtime")
    raise AssertionError("every name hashed to one master")


@pytest.fixture
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    with RedisClusterServers(tmp_path_factory.mktemp("redis-cluster"), FIRST_PORT) as servers:
        yield servers


def test_a_master_dies_mid_run_and_its_replica_carries_the_budget(
        servers: RedisClusterServers, pg_url: str, tmp_path: Path) -> None:
    killed, kept = on_two_masters(servers)
    victim = servers.master_of(bucket_key(killed.name))
    with LimiterCluster(pg_url, REDIS_URL, tmp_path, (killed, kept),
                        limiter_url=servers.url) as cluster:
        jobs = {s.name: cluster.submit(s) for s in (killed, kept)}
        # Each first burst spent and seconds of refill drawn: the buckets are empty, where
        # a budget that forgot its state would cost 429s.
        deadline = time.monotonic() + 60
        while any(cluster.admitted(s) < s.request_capacity + 60 for s in (killed, kept)):
            assert time.monotonic() < deadline, [cluster.admitted(s) for s in (killed, kept)]
            time.sleep(0.2)
        before = {s.name: cluster.admitted(s) for s in (killed, kept)}
        servers.kill(victim)
        failover_s = servers.wait_failover(victim, bucket_key(killed.name))
        during = {s.name: cluster.admitted(s) - before[s.name] for s in (killed, kept)}
        outcomes = {s.name: cluster.wait(s, jobs[s.name], timeout=120) for s in (killed, kept)}
        # The budgets lived on the cluster, not in the broker's Redis.
        assert not redis_keys("*rl:failover*")
        replica = servers.master_of(bucket_key(killed.name))
        assert replica != victim and servers.client(replica).exists(bucket_key(killed.name))
    print(f"\nfailover of {victim} to {replica}: {failover_s:.1f}s; admitted before "
          f"{before}, meanwhile {during}")
    for name, outcome in outcomes.items():
        print(f"{name}: {outcome.completed}/{outcome.items} completed in {outcome.seconds:.1f}s, "
              f"{outcome.rejected_429} x 429, {outcome.duplicate_bodies} repeats, "
              f"utilisation {outcome.utilisation:.3f}")
        assert outcome.status == "completed" and outcome.completed == outcome.items, outcome
        assert outcome.duplicate_bodies == 0, outcome
        assert outcome.rejected_429 == 0, outcome
    assert failover_s < 10
    # The other master's budget was never stopped by the failover: it kept admitting, and
    # was used as fully as without one (0.96-0.99 here). With require-full-coverage yes
    # and cluster errors untranslated, one run of two fell to 0.63 (batches failed, to be
    # retried much later); the next test catches the untranslated errors every time.
    assert during[kept.name] > 0, during
    assert outcomes[kept.name].utilisation >= 0.9, outcomes[kept.name]


def test_slots_with_no_node_left_make_the_limiter_wait_not_fail(
        tmp_path: Path) -> None:
    # A master and its replica both gone: with require-full-coverage yes (Redis's default)
    # the whole cluster answers CLUSTERDOWN, and the dead slots' node refuses connections.
    # Either way a worker must see ServiceUnavailable (it gives the batch back and tries
    # again later), never another exception that would fail the batch.
    with RedisClusterServers(tmp_path, FIRST_PORT, full_coverage=True) as servers:
        limiter = RedisLimiter(servers.url)
        budgets = [Budget(f"down-{n}", 1_200, 10**6, 60) for n in range(12)]
        for budget in budgets:
            assert limiter.acquire(budget, [10], 0.0).admitted == 1
        dead = servers.master_of(bucket_key(budgets[0].name))
        for port in [dead, *servers.replicas_of(dead)]:
            servers.kill(port)
        lost = [b for b in budgets if servers.master_of(bucket_key(b.name)) == dead]
        live = [b for b in budgets if b not in lost]
        assert lost and live
        deadline = time.monotonic() + 30
        while servers.client(servers.master_ports()[0]).cluster("info")[
                "cluster_state"] == "ok":
            assert time.monotonic() < deadline, "the cluster never saw its slots uncovered"
            time.sleep(0.1)
        for budget in (lost[0], live[0]):
            with pytest.raises(ServiceUnavailable, match="limiter's Redis is unreachable"):
                limiter.acquire(budget, [10], 0.0)

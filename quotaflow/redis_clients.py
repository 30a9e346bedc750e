"""One way to open the limiter's Redis: a single server, or a Redis Cluster.

The limiter, the circuit breakers and the fair shares keep their state in
Redis (`QUOTAFLOW_REDIS_URL`). One server is a ceiling on acquisitions per
second and a single point of failure; a Redis Cluster spreads the budgets over
its masters and fails over to a replica when one dies. Operators name a
cluster by its scheme, as other clients do:

    redis+cluster://host:7000                 one seed node; the rest are discovered
    redis+cluster://host1:7000,host2:7000     several seeds, tried in turn
    rediss+cluster://user:secret@host:7000    TLS and ACL credentials as in redis://

A cluster has one database, so a URL naming another (`/3`) is refused. Every
script call keeps its keys in one slot (the hash tags of limiters.bucket_key,
circuit.circuit_key and fairshare.fair_key), and nothing here scans keys or
pipelines across them, so the cluster client routes each call to one master.

The broker stays a plain Redis: Celery's Redis transport cannot use a cluster.
"""

from typing import Any, cast
from urllib.parse import unquote, urlsplit

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import ClusterError, RedisClusterException, TryAgainError

from quotaflow.errors import ServiceUnavailable
from quotaflow.redis_urls import CLUSTER_SCHEMES, is_cluster_url, seed_addresses

# What a Redis, or a cluster between a master's death and its replica's promotion,
# raises when it cannot answer now but may shortly: the caller waits and asks again.
UNREACHABLE: tuple[type[Exception], ...] = (
    redis.ConnectionError, redis.TimeoutError, ClusterError, TryAgainError,
    RedisClusterException)

RedisClient = redis.Redis | RedisCluster


def _seeds(url: str) -> list[ClusterNode]:
    return [ClusterNode(host, port) for host, port in seed_addresses(url)]


def connect(url: str, **options: float) -> RedisClient:
    """A client for the Redis or Redis Cluster `url` names; `options` are socket timeouts.

    A cluster client reads the slot map when it is made: a cluster that cannot be
    reached then is a ServiceUnavailable, which a worker answers by trying again later.
    """
    if not is_cluster_url(url):
        return redis.Redis.from_url(url, **options)
    parts = urlsplit(url)
    try:
        return RedisCluster(
            startup_nodes=_seeds(url), ssl=CLUSTER_SCHEMES[parts.scheme] == "rediss",
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
            **cast(dict[str, Any], options))
    except UNREACHABLE as exc:
        raise ServiceUnavailable(
            f"no node of the Redis Cluster in QUOTAFLOW_REDIS_URL answered "
            f"({exc.__class__.__name__}); check that the cluster is up") from exc

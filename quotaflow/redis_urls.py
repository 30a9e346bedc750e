"""What a Redis URL names: one server, or a Redis Cluster and its seed nodes.

Apart from redis_clients.py so that reading the settings (config.py, which checks
QUOTAFLOW_REDIS_URL) does not import redis-py: the CLI's `submit` and `results`
read the settings and never open a Redis, and the import was a tenth of a second
of their start.
"""

from urllib.parse import urlsplit

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
PLAIN_SCHEMES = ("redis", "rediss", "unix")


def is_cluster_url(url: str) -> bool:
    return urlsplit(url).scheme in CLUSTER_SCHEMES


def check_url(url: str) -> str:
    """`url`, if it names a Redis or a Redis Cluster quotaflow can open; else a
    ValueError that says what is wrong (the settings show it with the variable's name)."""
    parts = urlsplit(url)
    if parts.scheme in PLAIN_SCHEMES:
        return url
    if parts.scheme not in CLUSTER_SCHEMES:
        raise ValueError(
            f"unknown scheme {parts.scheme!r}: use redis://, rediss:// or unix:// for one "
            "Redis, redis+cluster:// or rediss+cluster:// for a Redis Cluster")
    seed_addresses(url)
    return url


def seed_addresses(url: str) -> list[tuple[str, int]]:
    """The (host, port) of each seed node a cluster URL names."""
    parts = urlsplit(url)
    if parts.query:
        raise ValueError("a cluster URL takes no ?options (they would be ignored): give "
                         "host:port seeds, and credentials before an @")
    if parts.path.strip("/") not in ("", "0"):
        raise ValueError(f"a Redis Cluster has only database 0, not {parts.path.strip('/')!r}; "
                         "drop the path from the URL")
    hosts = parts.netloc.rpartition("@")[2]
    seeds = []
    for seed in filter(None, hosts.split(",")):
        host, _, port = seed.rpartition(":") if ":" in seed else (seed, "", "6379")
        if not host or not port.isdigit():
            raise ValueError(f"seed node {seed!r} is not host:port")
        seeds.append((host.strip("[]"), int(port)))
    if not seeds:
        raise ValueError("name at least one node of the cluster, e.g. redis+cluster://host:7000")
    return seeds

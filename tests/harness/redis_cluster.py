"""A real Redis Cluster on loopback: redis-server processes in cluster mode, joined by
`redis-cli --cluster create`, that a test may kill a master of (by pid) to see a
replica take over.

Used by tests/cluster/test_redis_cluster.py (failover under four workers) and
bench/limiter.py --redis-cluster (acquisitions/s against 1 and 3 masters). The
nodes keep nothing on disk (no RDB, no AOF): what a failover keeps is what the
replica had received, as in a cluster run for speed.
"""

import shutil
import subprocess
import time
from pathlib import Path

import redis
from redis.crc import key_slot

# A master unreachable this long is failed over by its replica: short, so a test
# sees the promotion within a few seconds (Redis's default is 15 s). Unless told
# `full_coverage`, the nodes serve the slots they hold while another master's are down
# (require-full-coverage no, as docs/scaling.md advises): a budget on a live master
# never waits for a failover.
NODE_TIMEOUT_MS = 1000
SLOTS = 16384


class RedisClusterServers:
    """`masters` masters with `replicas` replicas each, on consecutive ports from
    `first_port` (the cluster bus on port + 10000). One master takes every slot itself:
    `redis-cli --cluster create` wants three."""

    def __init__(self, workdir: Path, first_port: int, masters: int = 3,
                 replicas: int = 1, full_coverage: bool = False) -> None:
        binary = shutil.which("redis-server")
        assert binary and shutil.which("redis-cli"), "redis-server is installed by scripts/test"
        self.binary, self.workdir = binary, workdir
        self.masters, self.replicas = masters, replicas
        self.full_coverage = "yes" if full_coverage else "no"
        self.ports = list(range(first_port, first_port + masters * (1 + replicas)))
        self.procs: dict[int, subprocess.Popen] = {}

    @property
    def url(self) -> str:
        """The QUOTAFLOW_REDIS_URL of the cluster: every node a seed."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=2)

    def __enter__(self) -> "RedisClusterServers":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def start(self) -> None:
        for port in self.ports:
            folder = self.workdir / f"redis-{port}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "nodes.conf").unlink(missing_ok=True)  # a new cluster, not a past one
            self.procs[port] = subprocess.Popen(
                [self.binary, "--port", str(port), "--bind", "127.0.0.1",
                 "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                 "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                 "--cluster-require-full-coverage", self.full_coverage, "--save", "",
                 "--appendonly", "no", "--dir", str(folder), "--logfile", "redis.log"],
                stdout=subprocess.DEVNULL, start_new_session=True)
        for port in self.ports:
            self._wait(lambda p=port: self.client(p).ping(), f"node {port} did not start")
        if self.masters == 1 and not self.replicas:
            self.client(self.ports[0]).execute_command("CLUSTER", "ADDSLOTSRANGE", 0, SLOTS - 1)
        else:
            subprocess.run(
                ["redis-cli", "--cluster", "create",
                 *(f"127.0.0.1:{port}" for port in self.ports),
                 "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                check=True, capture_output=True, timeout=60)
        self.wait_healthy()

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Every live node says the cluster is ok, with `masters` masters each holding
        `replicas` replicas whose link is up."""
        def healthy() -> bool:
            live = [port for port in self.ports if self.alive(port)]
            if any(self.client(port).cluster("info")["cluster_state"] != "ok" for port in live):
                return False
            roles = [self.client(port).info("replication") for port in live]
            return (sum(role["role"] == "master" for role in roles) == self.masters
                    and all(role.get("master_link_status") == "up"
                            for role in roles if role["role"] == "slave"))
        self._wait(healthy, "the cluster did not become healthy", timeout)

    def alive(self, port: int) -> bool:
        return port in self.procs and self.procs[port].poll() is None

    def master_ports(self) -> list[int]:
        return [port for port in self.ports
                if self.alive(port) and self.client(port).info("replication")["role"] == "master"]

    def master_of(self, key: str) -> int:
        """The port of the live master serving `key`'s slot, as a live node sees it."""
        slot = key_slot(key.encode())
        for port in self.ports:
            if not self.alive(port):
                continue
            for start, end, master, *_ in self.client(port).execute_command("CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    return int(master[1])
        raise LookupError(f"no live node serves slot {slot}")

    def replicas_of(self, port: int) -> list[int]:
        info = self.client(port).info("replication")
        return [int(info[f"slave{n}"]["port"]) for n in range(info["connected_slaves"])]

    def kill(self, port: int) -> None:
        """SIGKILL one node by its pid: no shutdown, no last write to its replica."""
        proc = self.procs[port]
        proc.kill()
        proc.wait(10)

    def wait_failover(self, dead: int, key: str, timeout: float = 30.0) -> float:
        """Seconds until a live master serves `key` again (the dead one's replica)."""
        start = time.monotonic()
        self._wait(lambda: self.master_of(key) != dead
                   and all(self.client(port).cluster("info")["cluster_state"] == "ok"
                           for port in self.ports if self.alive(port)),
                   f"no replica took over from {dead}", timeout)
        return time.monotonic() - start

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def _wait(self, ready, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if ready():
                    return
            except (redis.RedisError, LookupError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(what)
            time.sleep(0.1)

"""Four hosts as network namespaces (tests/harness/netns.py), with the network between them played
by proxies (tests/harness/netproxy.py):

- host A: a PostgreSQL and a Redis of its own (listening on A's address), and the API;
- hosts B and C: two Celery workers each, C's with its clock `skew_s` ahead (faketime);
- host D: the strict mock provider.

B and C reach A's servers and D's provider through a proxy in their own namespace (on
127.0.0.1 there), which adds the one-way delay to every chunk and can lose or block
traffic. The test, in the machine's own namespace, reaches PostgreSQL and Redis through
their Unix sockets and the API and the provider through Unix sockets the proxies of A and
D forward: nothing of ours listens on, or routes to, the machine's own network.
"""

import atexit
import contextlib
import json
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import redis
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.db import session_factory, upgrade
from tests.harness.netns import Network
from tests.harness.procs import Proc, quotaflow
from tests.harness.servers import ROOT, service_env

HOSTS = ("a", "b", "c", "d")
WORKER_HOSTS = ("b", "c")
WORKERS_PER_HOST = 2
CONCURRENCY = 2
PORTS = {"postgres": 5432, "redis": 6379, "api": 8000, "provider": 9000}


@dataclass(frozen=True)
class Budget:
    """The provider's limits, and the deployment's (the same)."""

    rpm: int = 1200
    tpm: int = 10_000_000
    burst_seconds: float = 5.0
    latency_ms: int = 100

    @property
    def request_capacity(self) -> float:
        return self.rpm * self.burst_seconds / 60


class MultihostCluster:
    def __init__(self, workdir: Path, budget: Budget, delay_ms: float = 4.0,
                 skew_s: float = 5.0, **worker_env: str) -> None:
        self.workdir = workdir
        self.budget = budget
        self.delay_ms = delay_ms
        self.skew_s = skew_s
        self.worker_env = worker_env
        self.net = Network(HOSTS)
        # Unix socket paths must stay short (108 bytes): not under pytest's tmp_path.
        self.sockets = Path(tempfile.mkdtemp(prefix="qfmh-", dir="/tmp"))
        self.pg_data = self.sockets / "pg"
        self.procs: list[Proc] = []
        self.workers: dict[str, list[Proc]] = {}
        self.pg_url = (f"postgresql+psycopg://postgres@/postgres?host={self.sockets}"
                       f"&port={PORTS['postgres']}")
        self.redis_url = f"unix://{self.sockets}/redis.sock?db=0"

    # -- the machine's view -------------------------------------------------------------

    def api(self) -> httpx.Client:
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.sockets / "api.sock")),
                            base_url="http://api", timeout=60)

    def provider(self) -> httpx.Client:
        return httpx.Client(
            transport=httpx.HTTPTransport(uds=str(self.sockets / "provider.sock")),
            base_url="http://provider", timeout=30)

    def sessions(self) -> sessionmaker[Session]:
        """Sessions on host A's database, through its Unix socket (cached per URL)."""
        return session_factory(self.pg_url)

    def control(self, host: str, **command: object) -> dict:
        """Change what `host`'s proxy does (delay_ms, loss, block); its state and counters."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(10)
            sock.connect(str(self.sockets / f"proxy-{host}.sock"))
            sock.sendall(json.dumps(command).encode() + b"\n")
            return json.loads(sock.makefile().readline())

    def shape(self, **command: object) -> None:
        for host in WORKER_HOSTS:
            self.control(host, **command)

    # -- start and stop -----------------------------------------------------------------

    def start(self) -> "MultihostCluster":
        atexit.register(self.stop)  # PostgreSQL runs as a daemon, not as one of our Procs
        try:
            self.net.create()
            self._start_postgres()
            self._start_redis()
            self._start_proxies()
            self._start_api_and_provider()
            self.shape(delay_ms=self.delay_ms)
            for host in WORKER_HOSTS:
                self.start_workers(host, self.skew_s if host == "c" else 0.0)
            for procs in self.workers.values():
                for worker in procs:
                    worker.wait_until(lambda w=worker: " ready." in w.log(), timeout=120)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.stop(timeout=10)
        self.procs.clear()
        if (self.pg_data / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                self._as_postgres("pg_ctl", "-D", str(self.pg_data), "-m", "immediate", "-w",
                                  "stop")
        self.net.destroy()
        shutil.rmtree(self.sockets, ignore_errors=True)

    def _spawn(self, host: str, name: str, argv: list[str], env: dict[str, str]) -> Proc:
        proc = Proc(name, self.net.exec_argv(host, argv), env, self.workdir)
        self.procs.append(proc)
        return proc

    def _as_postgres(self, tool: str, *args: str) -> None:
        binary = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{tool}"))[-1]
        command = " ".join([str(binary), *args])
        subprocess.run(self.net.exec_argv("a", ["su", "postgres", "-c", command]), check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)

    def _start_postgres(self) -> None:
        self.pg_data.mkdir()
        shutil.chown(self.sockets, "postgres", "postgres")
        shutil.chown(self.pg_data, "postgres", "postgres")
        self._as_postgres("initdb", "-D", str(self.pg_data), "-A", "trust", "-U", "postgres")
        with (self.pg_data / "pg_hba.conf").open("a") as hba:  # the hosts' own subnet only
            hba.write(f"host all all 10.213.{self.net.subnet}.0/24 trust\n")
        options = (f"-p {PORTS['postgres']} -k {self.sockets} -c max_connections=200 "
                   f"-c listen_addresses={self.net.address('a')} -c fsync=off")
        self._as_postgres("pg_ctl", "-D", str(self.pg_data), "-l", str(self.pg_data / "log"),
                          "-w", "-o", f"'{options}'", "start")
        upgrade(self.pg_url)

    def _start_redis(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is installed by scripts/test"
        sock = self.sockets / "redis.sock"
        self._spawn("a", "redis-a", [binary, "--port", str(PORTS["redis"]), "--bind",
                                     self.net.address("a"), "--unixsocket", str(sock),
                                     "--unixsocketperm", "700", "--save", "",
                                     # reachable from the namespaces' subnet alone
                                     "--protected-mode", "no", "--appendonly",
                                     "no", "--dir", str(self.workdir)], service_env())
        client = redis.Redis.from_url(self.redis_url)
        for _ in range(200):
            with contextlib.suppress(redis.ConnectionError, FileNotFoundError):
                if client.ping():
                    return
            time.sleep(0.05)
        raise TimeoutError("host A's redis did not start")

    def _start_proxies(self) -> None:
        proxy = [*quotaflow()[:1], "-m", "tests.harness.netproxy"]
        env = service_env(PYTHONPATH=str(ROOT))
        a, d = self.net.address("a"), self.net.address("d")
        for host in WORKER_HOSTS:
            routes = [f"--route={name}=127.0.0.1:{PORTS[name]}={address}:{PORTS[name]}"
                      for name, address in (("postgres", a), ("redis", a), ("provider", d))]
            self._spawn(host, f"proxy-{host}", [*proxy, f"--control={self._sock(host)}",
                                                *routes], env)
        self._spawn("a", "proxy-a", [*proxy, f"--control={self._sock('a')}",
                                     f"--pass=api=unix:{self.sockets}/api.sock="
                                     f"127.0.0.1:{PORTS['api']}"], env)
        self._spawn("d", "proxy-d", [*proxy, f"--control={self._sock('d')}",
                                     f"--pass=provider=unix:{self.sockets}/provider.sock="
                                     f"{d}:{PORTS['provider']}"], env)
        for host in HOSTS:
            deadline = time.monotonic() + 30
            while not Path(self._sock(host)).exists():
                assert time.monotonic() < deadline, f"proxy of {host} did not start"
                time.sleep(0.1)

    def _sock(self, host: str) -> str:
        return str(self.sockets / f"proxy-{host}.sock")

    def deployments_file(self) -> Path:
        b = self.budget
        path = self.workdir / "deployments.toml"
        path.write_text(f'[deployments.strict]\nprovider = "openai"\n'
                        f'base_url = "http://127.0.0.1:{PORTS["provider"]}/v1"\n'
                        f'model = "strict"\nrpm = {b.rpm}\ntpm = {b.tpm}\n'
                        f'burst_seconds = {b.burst_seconds}\n'
                        # Priced, as a paid provider is: every result write then adds to
                        # the job's row of the spend ledger, the lock a worker cut off
                        # mid-transaction holds (tests/cluster/test_multihost.py).
                        'input_per_mtok = 0.15\noutput_per_mtok = 0.60\n'
                        '[routes]\n"*" = "strict"\n')
        return path

    def _start_api_and_provider(self) -> None:
        b, a = self.budget, self.net.address("a")
        provider = self._spawn("d", "provider", quotaflow(
            "mock-provider", "--host", self.net.address("d"), "--port", str(PORTS["provider"]),
            "--rpm", str(b.rpm), "--tpm", str(b.tpm), "--burst-seconds", str(b.burst_seconds),
            "--latency-ms", str(b.latency_ms)), service_env())
        api = self._spawn("a", "api", quotaflow("api", "--host", "127.0.0.1", "--port",
                                                str(PORTS["api"])), service_env(
            QUOTAFLOW_DATABASE_URL=f"postgresql+psycopg://postgres@{a}:{PORTS['postgres']}"
                                   "/postgres",
            QUOTAFLOW_BROKER_URL=f"redis://{a}:{PORTS['redis']}/0", QUOTAFLOW_AUTH="false",
            QUOTAFLOW_BATCH_SIZE="20", QUOTAFLOW_LARGEST_BATCH_SIZE="20",  # none growing
            QUOTAFLOW_DEPLOYMENTS_FILE=str(self.deployments_file())))
        with self.provider() as client:
            provider.wait_until(lambda: client.get("/healthz").status_code == 200)
        with self.api() as client:
            api.wait_until(lambda: client.get("/healthz").status_code == 200)

    def start_workers(self, host: str, skew_s: float = 0.0) -> list[Proc]:
        """`host`'s two workers, through its proxy; with their clock `skew_s` ahead."""
        env = service_env(
            QUOTAFLOW_DATABASE_URL=f"postgresql+psycopg://postgres@127.0.0.1:"
                                   f"{PORTS['postgres']}/postgres",
            QUOTAFLOW_BROKER_URL=f"redis://127.0.0.1:{PORTS['redis']}/0",
            QUOTAFLOW_DEPLOYMENTS_FILE=str(self.deployments_file()), **self.worker_env)
        clock: list[str] = []
        if skew_s:
            env["DONT_FAKE_MONOTONIC"] = "1"  # wall clock only, as a host's skew is
            clock = ["faketime", "-f", f"{skew_s:+g}s"]
        self.workers[host] = [
            self._spawn(host, f"worker-{host}{n}", [*clock, *quotaflow(
                "worker", "--queues", "realtime,standard,bulk", "--concurrency",
                str(CONCURRENCY), "--realtime-slots", "0", "--name", f"{host}{n}@qfmh")], env)
            for n in range(1, WORKERS_PER_HOST + 1)]
        return self.workers[host]

    def stop_workers(self, host: str) -> None:
        for proc in self.workers.pop(host, []):
            proc.stop(timeout=10)
            if proc in self.procs:
                self.procs.remove(proc)

    def blocking_transactions(self, host: str) -> int:
        """`host`'s transactions waiting for their client while another session waits for
        their locks: cut off now, it stalls the others."""
        with self.sessions()() as session:
            return session.scalar(text(
                "SELECT count(*) FROM pg_stat_activity AS a WHERE a.client_addr = "
                "CAST(:addr AS inet) AND a.state = 'idle in transaction' AND EXISTS ("
                "SELECT 1 FROM pg_stat_activity AS w WHERE a.pid = ANY(pg_blocking_pids(w.pid)))"),
                {"addr": self.net.address(host)})

    def open_transactions(self, host: str) -> int:
        """`host`'s sessions inside a transaction now: a cut made at once catches one open."""
        with self.sessions()() as session:
            return session.scalar(text(
                "SELECT count(*) FROM pg_stat_activity WHERE client_addr = CAST(:addr AS inet) "
                "AND xact_start IS NOT NULL AND state IN ('active', 'idle in transaction')"),
                {"addr": self.net.address(host)})

    def round_trip_ms(self, host: str = "b", pings: int = 30) -> float:
        """The median time of a Redis PING from `host`, through its proxy: the network's RTT
        as an application there sees it."""
        script = (f"import redis,time,statistics;c=redis.Redis(port={PORTS['redis']});"
                  f"c.ping();t=[]\nfor _ in range({pings}):\n s=time.perf_counter();c.ping();"
                  "t.append(time.perf_counter()-s)\nprint(statistics.median(t)*1000)")
        done = subprocess.run(self.net.exec_argv(host, [*quotaflow()[:1], "-c", script]),
                              capture_output=True, text=True, timeout=60, check=True)
        return float(done.stdout.strip())

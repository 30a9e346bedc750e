"""End-to-end throughput: requests/s from upload to `completed`, and CPU per request of
every part of the system.

    python -m bench.e2e                                   # 20,000 requests: 1, 2, 4 workers,
                                                          # embedded `quotaflow run`, bare clients
    python -m bench.e2e --sizes 20000,200000              # does the cost grow with the job?
    python -m bench.e2e --requests 5000 --workers 1,2 --only cluster
    python -m bench.e2e --json out.json --keep            # raw numbers; keep the logs

Everything it measures runs from the checkout it is started in: its child processes
get PYTHONPATH=<this repository>, so an installed quotaflow elsewhere is not used.
It starts its own services and stops them, by pid, when it ends (also on Ctrl-C):

- a throwaway PostgreSQL (initdb in a temporary directory, its own port, run as the
  postgres user as the test fixture does) and its own redis-server on a free port,
  so their CPU is this benchmark's alone and the machine's shared servers are
  never touched;
- the mock provider made unlimited and instant (`quotaflow mock-provider
  --unlimited --latency-ms 0`, a raw ASGI app), and a deployments file with one
  provider = "openai" deployment pointing at it with limits nothing reaches;
- `quotaflow api` (QUOTAFLOW_AUTH=false) and, per row, W `quotaflow worker
  --concurrency C` processes.

Rows:

- cluster, W workers: N distinct chat requests (OpenAI batch lines, distinct
  prompts so nothing is deduplicated, small max_tokens) are uploaded with POST /jobs
  (multipart); the clock runs from the start of the upload until the job's status in
  PostgreSQL is `completed` (read every 50 ms on one connection). Then the results in
  PostgreSQL must number N and the API must report N completed, 0 failed; a provider
  that saw other than N calls, or a body twice, is reported under the table. A
  warm-up job runs first on fresh workers,
  and each row starts on emptied tables.
- embedded: `quotaflow run FILE -o OUT` (SQLite in a temporary directory, no broker),
  against the same provider; timed from process start to exit, so it includes the
  interpreter's start, imports, migration and writing the output file.
- bare: an asyncio client sends the same N bodies to the provider, --bare-concurrency
  (64) in flight on keep-alive connections, and parses the answers, with no queue and no
  database: the ceiling of this machine with this provider. One row per client:
  httpx.AsyncClient (the client the workers use; spread over --httpx-clients clients,
  since one httpx client with 64 connections spends several times more CPU per request),
  aiohttp (where installed) and raw HTTP/1.1 on asyncio streams (the least a Python
  client can spend).

CPU is utime + stime from /proc of each component's whole process tree (the process,
its live descendants, and what they have reaped: a prefork worker's pool children, every
PostgreSQL backend and background process), as a delta across the job. Columns are
CPU-seconds per 1,000 requests, which is the same number as CPU-milliseconds per request.
"other" is the machine's busy CPU time (/proc/stat: user + nice + system) in the same
window not accounted to any column: this script itself and anything else running on
the machine, so a large "other" says the numbers are noisy.
"""

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import psycopg
import redis

from tests.harness.procs import Proc, free_port, quotaflow

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")
CHAT = "/v1/chat/completions"
MODEL = "bench-model"
DEPLOYMENT = "bench"
SCENARIOS = ("cluster", "embedded", "bare")
POLL_S = 0.05
COLUMNS = ("api", "workers", "postgres", "redis", "provider", "client")


# --- CPU accounting ------------------------------------------------------------------------------


def _process_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, clock ticks of utime + stime + cutime + cstime) of every process."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                raw = handle.read()
        except OSError:  # exited while we looked
            continue
        fields = raw[raw.rindex(b")") + 2:].split()
        # After "pid (comm) ": state ppid ... utime(12th) stime cutime cstime
        table[int(entry.name)] = (int(fields[1]), sum(int(f) for f in fields[11:15]))
    return table


def tree_cpu(roots: list[int], table: dict[int, tuple[int, int]]) -> float:
    """CPU-seconds of the trees under `roots`: each live process's own time plus what it
    has reaped (cutime/cstime), so exited children that were waited for still count."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    ticks, todo, seen = 0, list(roots), set()
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in table:
            continue
        seen.add(pid)
        ticks += table[pid][1]
        todo.extend(children.get(pid, ()))
    return ticks / TICK


def machine_busy() -> float:
    """CPU-seconds the whole machine has spent busy (user + nice + system) since boot."""
    with open("/proc/stat") as handle:
        fields = handle.readline().split()
    return sum(int(f) for f in fields[1:4]) / TICK


@dataclass
class Snapshot:
    at: float
    busy: float
    cpu: dict[str, float]


def snapshot(components: dict[str, list[int]]) -> Snapshot:
    table = _process_table()
    return Snapshot(time.monotonic(), machine_busy(),
                    {name: tree_cpu(pids, table) for name, pids in components.items()})


# --- processes -----------------------------------------------------------------------------------


def child_env(**extra: str) -> dict[str, str]:
    """Our environment minus any QUOTAFLOW_* of the caller's, running this checkout's code."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUOTAFLOW_")}
    env["PYTHONPATH"] = str(ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


class ThrowawayPostgres:
    """initdb in a temporary directory and a server on its own port, as the postgres user
    (tests/conftest.py's throwaway_postgres); stopped and deleted at the end."""

    def __init__(self, options: list[str]) -> None:
        binaries = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
        if not binaries:
            raise RuntimeError("PostgreSQL's server binaries are not installed "
                               "(scripts/test installs them)")
        self.bin = binaries[-1].parent
        self.data = Path(tempfile.mkdtemp(prefix="qf-bench-pg-", dir="/tmp"))
        shutil.chown(self.data, "postgres", "postgres")
        self.port = free_port()
        self.options = options
        self.pid: int | None = None

    def _as_postgres(self, *argv: str) -> None:
        subprocess.run(["su", "postgres", "-c", " ".join(argv)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)

    def start(self) -> str:
        self._as_postgres(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust",
                          "-U", "postgres")
        settings = " ".join(f"-c {option}" for option in
                            ["listen_addresses=127.0.0.1", "max_connections=300", *self.options])
        self._as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l",
                          str(self.data / "log"), "-w", "-o",
                          f"'-p {self.port} -k {self.data} {settings}'", "start")
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            try:
                self._as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast",
                                  "-w", "stop")
            except (subprocess.SubprocessError, OSError):
                if self.pid is not None:  # only the postmaster we started
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self.pid, signal.SIGQUIT)
        shutil.rmtree(self.data, ignore_errors=True)


class ThrowawayRedis:
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        binary = shutil.which("redis-server")
        if not binary:
            raise RuntimeError("redis-server is not installed (scripts/test installs it)")
        self.log = (workdir / "redis.log").open("wb")
        self.popen = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(workdir)],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        client = redis.Redis(port=self.port)
        try:
            for _ in range(200):
                with contextlib.suppress(redis.ConnectionError):
                    client.ping()
                    break
                time.sleep(0.05)
            else:
                raise TimeoutError("throwaway redis did not start")
            self.version = client.info()["redis_version"]
        except BaseException:
            self.stop()
            raise
        finally:
            client.close()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(10)
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)
        self.log.close()


# --- the work ------------------------------------------------------------------------------------


def request_line(index: int, tag: str, max_tokens: int) -> dict:
    """One OpenAI batch line; its prompt is distinct, so nothing is deduplicated."""
    prompt = f"{tag} request {index}: name one colour of the number {index * 7919 % 100003}."
    return {"custom_id": f"{tag}-{index}", "method": "POST", "url": CHAT,
            "body": {"model": MODEL, "max_tokens": max_tokens,
                     "messages": [{"role": "user", "content": prompt}]}}


def write_requests(path: Path, count: int, tag: str, max_tokens: int) -> Path:
    with path.open("w", encoding="utf-8") as handle:
        for index in range(count):
            handle.write(json.dumps(request_line(index, tag, max_tokens)) + "\n")
    return path


def deployments_file(path: Path, provider_url: str) -> Path:
    path.write_text(f'[deployments.{DEPLOYMENT}]\nprovider = "openai"\n'
                    f'base_url = "{provider_url}/v1"\nmodel = "{MODEL}"\n'
                    "rpm = 1000000000\ntpm = 1000000000000\n"
                    f'[routes]\n"*" = "{DEPLOYMENT}"\n')
    return path


@dataclass
class Row:
    scenario: str
    requests: int
    seconds: float
    submit_seconds: float | None = None
    cpu: dict[str, float] = field(default_factory=dict)  # CPU-seconds per component
    other_cpu: float = 0.0
    notes: str = ""

    @property
    def rate(self) -> float:
        return self.requests / self.seconds

    def per_thousand(self, name: str) -> float | None:
        value = self.cpu.get(name)
        return None if value is None else value * 1000 / self.requests


class Bench:
    """The services every row shares, started once; stopped by `close`."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.procs: list[Proc] = []
        self.postgres: ThrowawayPostgres | None = None
        self.redis: ThrowawayRedis | None = None
        self.api: Proc | None = None
        self.db_url = ""
        self.versions: dict[str, str] = {}
        port = free_port()
        self.provider_url = f"http://127.0.0.1:{port}"
        self.deployments = deployments_file(workdir / "deployments.toml", self.provider_url)

    def start_provider(self) -> None:
        port = self.provider_url.rsplit(":", 1)[1]
        self.provider = self._start("provider", quotaflow(
            "mock-provider", "--unlimited", "--latency-ms", "0", "--port", port), child_env())
        self.provider.wait_http(f"{self.provider_url}/healthz")

    def _start(self, name: str, argv: list[str], env: dict[str, str]) -> Proc:
        proc = Proc(name, argv, env, self.workdir, cwd=self.workdir)
        self.procs.append(proc)
        return proc

    def _stop(self, proc: Proc) -> None:
        proc.stop()
        self.procs.remove(proc)

    def close(self) -> None:
        # Bounded (each stop has a timeout); a second Ctrl-C must not leave half of it running.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for proc in reversed(self.procs):
            with contextlib.suppress(Exception):
                proc.stop()
        self.procs.clear()
        if self.redis:
            self.redis.stop()
        if self.postgres:
            self.postgres.stop()

    # --- the cluster ---

    def settings_env(self, **extra: str) -> dict[str, str]:
        env = {"QUOTAFLOW_DEPLOYMENTS_FILE": str(self.deployments),
               "QUOTAFLOW_MAX_LINES": str(max(self.args.sizes) + 1000)}
        if self.args.batch_size:
            env["QUOTAFLOW_BATCH_SIZE"] = str(self.args.batch_size)
        return child_env(**env, **extra)

    def cluster_env(self) -> dict[str, str]:
        return self.settings_env(QUOTAFLOW_DATABASE_URL=self.db_url,
                                 QUOTAFLOW_BROKER_URL=self.redis.url, QUOTAFLOW_AUTH="false")

    def start_cluster(self) -> None:
        self.postgres = ThrowawayPostgres(self.args.pg_option)
        self.db_url = self.postgres.start()
        self.redis = ThrowawayRedis(self.workdir)
        migrate = subprocess.run(quotaflow("db", "upgrade"), env=self.cluster_env(),
                                 cwd=self.workdir, capture_output=True, text=True, timeout=300)
        if migrate.returncode:
            raise RuntimeError(f"quotaflow db upgrade failed:\n{migrate.stdout}{migrate.stderr}")
        with self._db() as conn:
            self.versions["postgres"] = conn.execute("SHOW server_version").fetchone()[0]
            if self.args.pg_statements:
                conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        self.versions["redis"] = self.redis.version
        self.api_url = f"http://127.0.0.1:{free_port()}"
        self.api = self._start("api", quotaflow("api", "--port", self.api_url.rsplit(":", 1)[1]),
                               self.cluster_env())
        self.api.wait_http(f"{self.api_url}/healthz")

    def _db(self) -> psycopg.Connection:
        return psycopg.connect(self.db_url.replace("postgresql+psycopg://", "postgresql://"),
                               autocommit=True)

    def cluster_row(self, workers: int, size: int) -> Row:
        with self._db() as conn:
            conn.execute("TRUNCATE jobs, items, results, job_tallies CASCADE")
            conn.execute("CHECKPOINT")
        ports = [free_port() for _ in range(workers)] if self.args.metrics else []
        procs = [self._start(f"worker{n}-w{workers}-n{size}", quotaflow(
            "worker", "--concurrency", str(self.args.concurrency), "--name",
            f"bench{n}@e2e", *(("--metrics-port", str(ports[n - 1])) if ports else ())),
            self.cluster_env()) for n in range(1, workers + 1)]
        scraper = Scraper([self.api_url, *(f"http://127.0.0.1:{port}" for port in ports)],
                          self.args.scrape_interval)
        try:
            for proc in procs:
                proc.wait_until(lambda p=proc: " ready." in p.log())
            if ports:
                scraper.start()
            if self.args.warmup:
                warm = write_requests(self.workdir / "warmup.jsonl", self.args.warmup,
                                      f"warm{workers}x{size}", self.args.max_tokens)
                self._run_job(warm, self.args.warmup, procs, label="warm-up")
            path = write_requests(self.workdir / f"cluster-{size}.jsonl", size,
                                  f"w{workers}n{size}", self.args.max_tokens)
            row = self._run_job(path, size, procs,
                                label=f"cluster, {workers} worker{'s' * (workers > 1)}")
        finally:
            scraper.stop()
            for proc in procs:
                self._stop(proc)
        if ports:
            row.notes += f"; metrics: {scraper.scrapes} scrapes, {scraper.calls:.0f} calls counted"
        return row

    def _run_job(self, path: Path, size: int, workers: list[Proc], label: str) -> Row:
        components = {"api": [self.api.pid], "workers": [w.pid for w in workers],
                      "postgres": [self.postgres.pid], "redis": [self.redis.popen.pid],
                      "provider": [self.provider.pid]}
        provider_before = httpx.get(f"{self.provider_url}/stats").json()
        statements = self.args.pg_statements and label != "warm-up"
        with self._db() as conn, httpx.Client(base_url=self.api_url, timeout=600) as api:
            if statements:
                conn.execute("SELECT pg_stat_statements_reset()")
            before = snapshot(components)
            with path.open("rb") as handle:
                answer = api.post("/jobs", files={"file": (path.name, handle,
                                                           "application/jsonl")},
                                  data={"queue": self.args.queue})
            submitted = time.monotonic()
            if answer.status_code != 201:
                raise RuntimeError(f"POST /jobs answered {answer.status_code}: {answer.text}")
            job_id = answer.json()["id"]
            deadline = before.at + self.args.timeout
            while (status := conn.execute("SELECT status FROM jobs WHERE id = %s",
                                          (job_id,)).fetchone()[0]) in ("validating",
                                                                        "in_progress"):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{label}: job {job_id} not completed after "
                                       f"{self.args.timeout:.0f} s: "
                                       f"{self._results(conn, job_id)} of {size} results")
                time.sleep(POLL_S)
            after = snapshot(components)
            if statements:
                print(statement_table(conn, size, self.args.pg_statements), file=sys.stderr)
            results = self._results(conn, job_id)
            view = api.get(f"/jobs/{job_id}").json()
        counts = view["request_counts"]
        if status != "completed" or results != size or counts["completed"] != size:
            raise RuntimeError(f"{label}: job {job_id} {status}, {results} results of {size}, "
                               f"counts {counts}; worker log:\n{workers[0].log()}")
        provider_after = httpx.get(f"{self.provider_url}/stats").json()
        repeats = provider_after["duplicate_bodies"] - provider_before["duplicate_bodies"]
        sent = provider_after["admitted"] - provider_before["admitted"]
        return Row(label, size, after.at - before.at, submitted - before.at,
                   {name: after.cpu[name] - before.cpu[name] for name in components},
                   _other(before, after), notes=_sent_note(sent, size, repeats))

    @staticmethod
    def _results(conn: psycopg.Connection, job_id: str) -> int:
        return conn.execute("SELECT count(*) FROM results WHERE job_id = %s",
                            (job_id,)).fetchone()[0]

    # --- embedded and bare ---

    def embedded_row(self, size: int) -> Row:
        path = write_requests(self.workdir / f"embedded-{size}.jsonl", size, f"emb{size}",
                              self.args.max_tokens)
        out = self.workdir / f"embedded-{size}.out.jsonl"
        database = self.workdir / f"embedded-{size}.db"
        env = self.settings_env(QUOTAFLOW_DATABASE_URL=f"sqlite:///{database}")
        argv = quotaflow("run", str(path), "-o", str(out), "--concurrency",
                         str(self.args.embedded_concurrency))
        components = {"provider": [self.provider.pid]}
        provider_before = httpx.get(f"{self.provider_url}/stats").json()
        before = snapshot(components)
        proc = self._start(f"embedded-{size}", argv, env)
        rusage = wait_with_rusage(proc, self.args.timeout, "embedded run")
        after = snapshot(components)
        self.procs.remove(proc)
        lines = sum(1 for _ in out.open("rb"))
        summary = proc.log(600)
        if proc.popen.returncode or lines != size or f"{size} succeeded" not in summary:
            raise RuntimeError(f"embedded run: exit {proc.popen.returncode}, {lines} result lines "
                               f"of {size}:\n{summary}")
        provider_after = httpx.get(f"{self.provider_url}/stats").json()
        repeats = provider_after["duplicate_bodies"] - provider_before["duplicate_bodies"]
        sent = provider_after["admitted"] - provider_before["admitted"]
        cpu = {"provider": after.cpu["provider"] - before.cpu["provider"],
               "client": rusage.ru_utime + rusage.ru_stime}
        return Row("embedded (quotaflow run)", size, after.at - before.at, None, cpu,
                   _other(before, after, cpu["client"]),
                   notes=_sent_note(sent, size, repeats) + "; SQLite, process start to exit")

    def bare_row(self, size: int, kind: str) -> Row:
        path = write_requests(self.workdir / f"bare-{size}.jsonl", size, f"bare{size}",
                              self.args.max_tokens)
        result_path = self.workdir / f"bare-{kind}-{size}.json"
        argv = [sys.executable, "-m", "bench.e2e", "--bare-client", kind, self.provider_url,
                str(path), str(result_path), str(self.args.bare_concurrency),
                str(self.args.httpx_clients)]
        components = {"provider": [self.provider.pid]}
        provider_before = httpx.get(f"{self.provider_url}/stats").json()
        proc = self._start(f"bare-{kind}-{size}", argv, child_env())
        proc.wait_until(lambda: "loaded" in proc.log(), timeout=120)
        before = snapshot(components)
        os.kill(proc.pid, signal.SIGUSR1)  # go
        wait_with_rusage(proc, self.args.timeout, "bare client")
        after = snapshot(components)
        self.procs.remove(proc)
        if proc.popen.returncode:
            raise RuntimeError(f"bare client exited with {proc.popen.returncode}:\n{proc.log()}")
        measured = json.loads(result_path.read_text())
        if measured["ok"] != size:
            raise RuntimeError(f"bare client: {measured['ok']} of {size} answered 200")
        provider_after = httpx.get(f"{self.provider_url}/stats").json()
        sent = provider_after["admitted"] - provider_before["admitted"]
        cpu = {"provider": after.cpu["provider"] - before.cpu["provider"],
               "client": measured["cpu"]}
        # The provider and the machine are read from the go signal to the child's exit; the
        # client's own figures cover its send loop only.
        shards = f", {self.args.httpx_clients} clients" if kind == "httpx" else ""
        label = f"bare {kind} ({self.args.bare_concurrency} in flight{shards})"
        return Row(label, size, measured["seconds"], None, cpu,
                   _other(before, after, measured["cpu"], after.at - before.at,
                          measured["seconds"]),
                   notes=f"provider saw {sent} calls; no queue, no database")


def _sent_note(sent: int, size: int, repeats: int) -> str:
    note = f"provider saw {sent} calls"
    if sent != size or repeats:
        note += f", {repeats} repeated bodies (WARNING: expected {size} calls, no repeats)"
    return note


def _other(before: Snapshot, after: Snapshot, extra: float = 0.0, window: float | None = None,
           measured: float | None = None) -> float:
    """Busy CPU of the machine in the window not accounted to a column."""
    busy = after.busy - before.busy
    if window and measured:  # the machine's busy time scaled to the measured part
        busy *= measured / window
    return max(0.0, busy - sum(after.cpu[n] - before.cpu[n] for n in after.cpu) - extra)


def wait_with_rusage(proc: Proc, timeout: float, label: str) -> resource.struct_rusage:
    """Wait for a child we started and return its rusage (its whole tree, as reaped)."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.popen.returncode = os.waitstatus_to_exitcode(status)
            return rusage
        if time.monotonic() > deadline:
            proc.stop()
            raise TimeoutError(f"{label} did not finish in {timeout:.0f} s:\n{proc.log()}")
        time.sleep(POLL_S)


# --- the bare client (a child process of the benchmark) ------------------------------------------


BARE_CLIENTS = ("httpx", "aiohttp", "raw")


def bare_client(kind: str, base_url: str, requests_path: Path, result_path: Path,
                in_flight: int, shards: int) -> None:
    """Send every line's body to the provider, `in_flight` at a time, and parse each answer;
    write the send loop's wall time and CPU. Starts when the parent sends SIGUSR1.

    httpx: `shards` AsyncClients sharing the requests (httpcore's pool scans each of its
    connections per request, so one client with 64 connections costs several times more
    per request than 8 with 8). aiohttp: one ClientSession. raw: HTTP/1.1 written and read
    on asyncio streams, one keep-alive connection per request in flight: the least a
    Python client can spend, so the ceiling of this machine with this provider.
    """
    lines = [json.loads(line) for line in requests_path.open("rb")]
    go = asyncio.Event()

    async def main() -> dict:
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, go.set)
        print(f"loaded {len(lines)} requests", flush=True)
        await go.wait()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        send = {"httpx": _send_httpx, "aiohttp": _send_aiohttp, "raw": _send_raw}[kind]
        ok = await send(base_url, iter(lines), in_flight, shards)
        seconds = time.perf_counter() - start
        spent = resource.getrusage(resource.RUSAGE_SELF)
        cpu = (spent.ru_utime + spent.ru_stime) - (usage.ru_utime + usage.ru_stime)
        return {"ok": ok, "seconds": seconds, "cpu": cpu}

    result_path.write_text(json.dumps(asyncio.run(main())))


async def _send_httpx(base_url: str, todo: Iterator[dict], in_flight: int, shards: int) -> int:
    per_shard = max(1, in_flight // shards)
    limits = httpx.Limits(max_connections=per_shard, max_keepalive_connections=per_shard)
    clients = [httpx.AsyncClient(base_url=base_url, limits=limits, timeout=60)
               for _ in range(shards)]
    ok = 0

    async def sender(client: httpx.AsyncClient) -> None:
        nonlocal ok
        for line in todo:
            answer = await client.post(line["url"], json=line["body"])
            ok += answer.status_code == 200 and "usage" in answer.json()

    try:
        await asyncio.gather(*(sender(clients[n % shards]) for n in range(in_flight)))
    finally:
        for client in clients:
            await client.aclose()
    return ok


async def _send_aiohttp(base_url: str, todo: Iterator[dict], in_flight: int, _shards: int
                        ) -> int:
    import aiohttp  # not a dependency of quotaflow: this row runs only where it is installed

    ok = 0
    connector = aiohttp.TCPConnector(limit=in_flight)
    async with aiohttp.ClientSession(base_url, connector=connector) as session:
        async def sender() -> None:
            nonlocal ok
            for line in todo:
                async with session.post(line["url"], json=line["body"]) as answer:
                    ok += answer.status == 200 and "usage" in await answer.json()

        await asyncio.gather(*(sender() for _ in range(in_flight)))
    return ok


async def _send_raw(base_url: str, todo: Iterator[dict], in_flight: int, _shards: int) -> int:
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    ok = 0

    async def connection() -> None:
        nonlocal ok
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            for line in todo:
                data = json.dumps(line["body"]).encode()
                writer.write(b"POST %s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json"
                             b"\r\ncontent-length: %d\r\n\r\n%s"
                             % (line["url"].encode(), host.encode(), len(data), data))
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(h[15:]) for h in head.split(b"\r\n")
                              if h[:15].lower() == b"content-length:")
                answer = json.loads(await reader.readexactly(length))
                ok += head.startswith(b"HTTP/1.1 200 ") and "usage" in answer
        finally:
            writer.close()

    await asyncio.gather(*(connection() for _ in range(in_flight)))
    return ok


def statement_table(conn: psycopg.Connection, size: int, top: int) -> str:
    """The statements that cost the server most during a job: calls and rows per
    request, and execution time per request in microseconds (the server's CPU for
    them, less I/O waits, on a warm cache)."""
    lines = [f"{'us/req':>7} {'calls/req':>9} {'rows/req':>8}  statement"]
    for total_ms, calls, rows, query in conn.execute(
            "SELECT total_exec_time, calls, rows, query FROM pg_stat_statements "
            "ORDER BY total_exec_time DESC LIMIT %s", (top,)):
        text = " ".join(query.split())[:110]
        lines.append(f"{1000 * total_ms / size:7.1f} {calls / size:9.3f} {rows / size:8.2f}  "
                     f"{text}")
    return "\n".join(lines)


# --- report --------------------------------------------------------------------------------------


def machine(versions: dict[str, str]) -> str:
    model = "unknown CPU"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as handle:
        model = next((line.split(":", 1)[1].strip() for line in handle
                      if line.startswith("model name")), model)
    with open("/proc/meminfo") as handle:
        mem_gib = int(handle.readline().split()[1]) / 1024 ** 2
    parser = "httptools" if importlib.util.find_spec("httptools") else "h11"
    extra = "".join(f", {name.title() if name != 'postgres' else 'PostgreSQL'} {version}"
                    for name, version in versions.items())
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"machine: {model}, {os.cpu_count()} cores, {mem_gib:.0f} GiB, {platform.machine()}, "
            f"Python {platform.python_version()}{extra}; provider HTTP parser {parser}; "
            f"load average at start {load}")


def default_batch_size() -> str:
    """QUOTAFLOW_BATCH_SIZE's default in the checkout being measured."""
    read = subprocess.run([sys.executable, "-c", "from quotaflow.config import Settings; "
                           "print(Settings(_env_file=None).batch_size)"],
                          env=child_env(), cwd=tempfile.gettempdir(), capture_output=True,
                          text=True, timeout=60, check=False)
    return read.stdout.strip() or "?"


def checkout() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                              check=False).stdout.strip()
    dirty = " (with uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") \
        else ""
    return f"code: {ROOT} at {git('rev-parse', '--short', 'HEAD') or '?'}{dirty}"


def table(rows: list[Row]) -> str:
    header = (f"{'scenario':<38} {'requests':>8} {'seconds':>8} {'req/s':>7} {'submit s':>8} "
              + " ".join(f"{name:>8}" for name in (*COLUMNS, "other"))
              + f" {'worker ms/req':>13}")
    lines = [header]
    for row in rows:
        cells = [f"{'-' if (v := row.per_thousand(n)) is None else f'{v:.2f}':>8}"
                 for n in COLUMNS]
        other = row.other_cpu * 1000 / row.requests
        worker = row.per_thousand("workers")
        submit = "-" if row.submit_seconds is None else f"{row.submit_seconds:.2f}"
        lines.append(f"{row.scenario:<38} {row.requests:>8,} {row.seconds:>8.2f} "
                     f"{row.rate:>7,.0f} {submit:>8} " + " ".join(cells)
                     + f" {other:>8.2f} {'-' if worker is None else f'{worker:.2f}':>13}")
    lines += [f"{row.scenario}: {row.notes}" for row in rows if "WARNING" in row.notes]
    return "\n".join(lines)


def _numbers(text: str) -> list[int]:
    try:
        values = [int(part.replace("_", "")) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1,2,4, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return values


def _bare_clients(text: str) -> list[str]:
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    if not chosen or set(chosen) - set(BARE_CLIENTS):
        raise argparse.ArgumentTypeError(f"choose from {', '.join(BARE_CLIENTS)}")
    return chosen


def _scenarios(text: str) -> list[str]:
    chosen = [part.strip() for part in text.split(",") if part.strip()]
    if not chosen or set(chosen) - set(SCENARIOS):
        raise argparse.ArgumentTypeError(f"choose from {', '.join(SCENARIOS)}")
    return chosen


class Scraper:
    """With --metrics: scrapes the API and every worker every `interval` seconds while a row
    runs, as a Prometheus server would (deploy/monitoring/prometheus.yml scrapes every
    15 s), so that the cost of serving /metrics is in the api and workers columns; counts
    the provider calls the workers' counters hold at the last scrape. Its own CPU (one
    kept connection per target, the pages parsed) is this process's, in "other"."""

    def __init__(self, urls: list[str], interval: float = 1.0) -> None:
        self.urls = urls
        self.interval = interval
        self.scrapes = 0
        self.calls = 0.0
        self._client = httpx.Client(timeout=10)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join(10)
            self._scrape()
        self._client.close()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._scrape()

    def _scrape(self) -> None:
        calls = 0.0
        for url in self.urls:
            page = self._client.get(f"{url}/metrics").text
            calls += sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
                         if line.startswith("quotaflow_provider_responses_total{"))
        self.scrapes += 1
        self.calls = calls


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000, help="Requests per job.")
    parser.add_argument("--sizes", type=_numbers, default=None,
                        help="Job sizes to run each scenario at, e.g. 20000,200000 "
                             "(default: --requests).")
    parser.add_argument("--workers", type=_numbers, default=[1, 2, 4],
                        help="Worker process counts, one cluster row each.")
    parser.add_argument("--concurrency", type=int, default=2,
                        help="`quotaflow worker --concurrency` (pool processes per worker).")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="QUOTAFLOW_BATCH_SIZE (default: the checkout's default).")
    parser.add_argument("--only", type=_scenarios, default=list(SCENARIOS),
                        help="Comma-separated: cluster, embedded, bare (default: all).")
    parser.add_argument("--queue", default="standard", help="Queue of the cluster jobs.")
    parser.add_argument("--max-tokens", type=int, default=8, help="max_tokens of each request.")
    parser.add_argument("--warmup", type=int, default=500,
                        help="Requests of the unmeasured job each cluster row starts with.")
    parser.add_argument("--embedded-concurrency", type=int, default=4,
                        help="`quotaflow run --concurrency` (batches in flight).")
    parser.add_argument("--bare-concurrency", type=int, default=64,
                        help="Requests in flight of the bare client.")
    parser.add_argument("--bare-clients", type=_bare_clients, default=None,
                        help="Comma-separated: httpx, aiohttp, raw (default: httpx and raw, "
                             "and aiohttp where it is installed).")
    parser.add_argument("--httpx-clients", type=int, default=8,
                        help="AsyncClients the bare httpx row spreads its requests over.")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="Seconds one job may take before the run is aborted.")
    parser.add_argument("--pg-option", action="append", default=[], metavar="NAME=VALUE",
                        help="A setting for the throwaway PostgreSQL (repeatable), "
                             "e.g. synchronous_commit=off.")
    parser.add_argument("--pg-statements", type=int, default=0, metavar="N",
                        help="Load pg_stat_statements in the throwaway PostgreSQL and print, "
                             "after each cluster row, its N costliest statements per request.")
    parser.add_argument("--scrape-interval", type=float, default=1.0, metavar="SECONDS",
                        help="With --metrics: seconds between scrapes (Prometheus as shipped: "
                             "15).")
    parser.add_argument("--metrics", action="store_true",
                        help="Start the workers with --metrics-port and scrape them and the "
                             "API's /metrics every second while the cluster rows run.")
    parser.add_argument("--json", type=Path, default=None, help="Also write the rows here.")
    parser.add_argument("--keep", action="store_true",
                        help="Keep the working directory (logs, input files).")
    args = parser.parse_args(argv)
    args.sizes = args.sizes or [args.requests]
    if args.pg_statements:
        args.pg_option.append("shared_preload_libraries=pg_stat_statements")
    if args.bare_clients is None:
        args.bare_clients = [kind for kind in BARE_CLIENTS
                             if kind != "aiohttp" or importlib.util.find_spec("aiohttp")]
    return args


def _raise_interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def workspace(keep: bool) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="qf-bench-e2e-"))
    try:
        yield path
    finally:
        if keep:
            print(f"logs and inputs kept in {path}", file=sys.stderr)
        else:
            shutil.rmtree(path, ignore_errors=True)


def run(args: argparse.Namespace) -> list[Row]:
    rows: list[Row] = []
    # Also where SIGINT came in ignored (a background job of a script): we stop what we started.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, _raise_interrupt)
    with workspace(args.keep) as workdir:
        bench = Bench(args, workdir)
        try:
            bench.start_provider()
            if "cluster" in args.only:
                bench.start_cluster()
            print(machine(bench.versions), flush=True)
            print(checkout(), flush=True)
            batch_size = args.batch_size or f"default ({default_batch_size()})"
            print(f"workers: --concurrency {args.concurrency}; batch size {batch_size}; "
                  f"max_tokens {args.max_tokens}; "
                  f"CPU columns are CPU-seconds per 1,000 requests (= CPU-ms per request)\n",
                  flush=True)
            plan: list[tuple[str, Callable[[], Row]]] = []
            for size in args.sizes:
                if "cluster" in args.only:
                    plan += [(f"cluster w={w} n={size}",
                              lambda w=w, size=size: bench.cluster_row(w, size))
                             for w in args.workers]
                if "embedded" in args.only:
                    plan.append((f"embedded n={size}", lambda size=size: bench.embedded_row(size)))
                if "bare" in args.only:
                    plan += [(f"bare {kind} n={size}",
                              lambda size=size, kind=kind: bench.bare_row(size, kind))
                             for kind in args.bare_clients]
            for label, measure in plan:
                print(f"... {label}", file=sys.stderr, flush=True)
                row = measure()
                rows.append(row)
                print(f"    {row.rate:,.0f} req/s; {row.notes}", file=sys.stderr, flush=True)
        finally:
            bench.close()
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([{**asdict(r), "rate": r.rate} for r in rows], indent=2))
    return rows


def main() -> None:
    if len(sys.argv) == 8 and sys.argv[1] == "--bare-client":  # a child of the benchmark
        kind, url, requests_path, result_path, in_flight, shards = sys.argv[2:]
        bare_client(kind, url, Path(requests_path), Path(result_path), int(in_flight),
                    int(shards))
        return
    try:
        run(parse_args())
    except KeyboardInterrupt as exc:
        print(f"interrupted ({exc}); everything this run started is stopped", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()

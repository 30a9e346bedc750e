"""Shared fixtures of tests/unit/ and tests/cluster/: a real, migrated PostgreSQL database,
a private Redis db index, servers of a test's own; the `cluster` marker by folder; the
reliability tables at the end of a run.

The tests use their own database (quotaflow_test) and Redis db 15 and never touch
anything else on the servers (tests/harness/servers.py).
"""

import shutil
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import text
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.config import Settings
from quotaflow.db import get_engine, session_factory, upgrade
from tests.harness.procs import Proc, free_port
from tests.harness.servers import PG_URL, REDIS_URL, recreate_database, service_env


@pytest.fixture(autouse=True)
def _fresh_api_runtime() -> Iterator[None]:
    """The API builds its parts once per process (api.deps.runtime); a test that points
    the API at other settings must not leave them to the next test."""
    yield
    deps = sys.modules.get("api.deps")
    if deps is not None:
        deps.runtime.cache_clear()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """No test leaves a process of ours behind, even one that failed before its cleanup.
    An xdist worker also hands its rows of the reliability table to the controller."""
    for proc in list(Proc.running):
        proc.stop(timeout=5)
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        from tests.harness import chaos_cluster, multihost_jobs
        workeroutput["chaos_rows"] = [list(row) for row in chaos_cluster.ROWS]
        workeroutput["multihost_rows"] = [list(row.cells()) for row in multihost_jobs.ROWS]


# The across-hosts table's rows that xdist workers handed over (their cells).
_MULTIHOST_CELLS: list[tuple[str, ...]] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist's controller: a worker's rows of the reliability tables, for the summary."""
    from tests.harness import chaos_cluster
    output = getattr(node, "workeroutput", {})
    chaos_cluster.ROWS.extend(tuple(row) for row in output.get("chaos_rows", []))
    _MULTIHOST_CELLS.extend(tuple(row) for row in output.get("multihost_rows", []))


@pytest.fixture(scope="session")
def pg_url() -> str:
    """A fresh quotaflow_test database, migrated with the same Alembic script production uses."""
    recreate_database(PG_URL)
    upgrade(PG_URL)
    return PG_URL


@pytest.fixture
def pg_sessions(pg_url: str) -> Iterator[sessionmaker[Session]]:
    """Sessions on the test database, emptied before each test."""
    with get_engine(pg_url).begin() as conn:
        conn.execute(text("TRUNCATE jobs, items, results, broker_runs, spend, job_tallies CASCADE"))
    yield session_factory(pg_url)


@pytest.fixture
def redis_url() -> str:
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()
    client.close()
    return REDIS_URL


@pytest.fixture
def settings(pg_url: str) -> Settings:
    return Settings(database_url=pg_url, broker_url=REDIS_URL, _env_file=None)


@pytest.fixture
def throwaway_redis(tmp_path: Path) -> Iterator[tuple[str, Callable[[], None], Callable[[], None]]]:
    """A redis-server of our own, which the test may stop and start again."""
    binary = shutil.which("redis-server")
    assert binary, "redis-server is installed by scripts/test"
    port = free_port()
    procs: list[subprocess.Popen] = []

    def start() -> None:
        procs.append(subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL))
        client = redis.Redis(port=port)
        for _ in range(100):
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise TimeoutError("throwaway redis did not start")

    def stop() -> None:
        procs[-1].terminate()
        procs[-1].wait(10)

    start()
    yield f"redis://127.0.0.1:{port}/0", start, stop
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(10)


@pytest.fixture
def throwaway_postgres() -> Iterator[tuple[str, Callable[[], None], Callable[[], None]]]:
    """A PostgreSQL server of our own (initdb in a temp dir, another port), migrated; the
    test may stop and start it. It runs as the postgres user, as PostgreSQL requires."""
    binaries = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    assert binaries, "PostgreSQL's server binaries are installed by scripts/test"
    bin_dir = binaries[-1].parent
    data = Path(tempfile.mkdtemp(prefix="qf-pg-", dir="/tmp"))
    shutil.chown(data, "postgres", "postgres")
    port = free_port()

    def as_postgres(*argv: str) -> None:
        subprocess.run(["su", "postgres", "-c", " ".join(argv)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)

    def start() -> None:
        as_postgres(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(data / "log"), "-w",
                    "-o", f"'-p {port} -k {data} -c listen_addresses=127.0.0.1'", "start")

    def stop() -> None:
        as_postgres(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop")

    as_postgres(str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres")
    start()
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    upgrade(url)
    try:
        yield url, start, stop
    finally:
        if (data / "postmaster.pid").exists():
            stop()
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture
def slow_provider(tmp_path: Path) -> Iterator[str]:
    """A mock provider answering in 100 ms, with no limit worth the name."""
    from tests.harness.procs import quotaflow

    port = free_port()
    proc = Proc("provider", quotaflow("mock-provider", "--port", str(port), "--rpm", "600000",
                                      "--tpm", "100000000", "--latency-ms", "100"),
                service_env(), tmp_path)
    try:
        proc.wait_http(f"http://127.0.0.1:{port}/healthz")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.stop()


# A test's folder says what it needs: tests/cluster/ is marked `cluster`, so that
# `pytest -m "not cluster"` runs tests/unit/ alone, in seconds, with no PostgreSQL or Redis.
# A unit test that asks for a server, or whose module starts processes, is refused at
# collection, naming the folder it belongs in.
TESTS = Path(__file__).resolve().parent
UNIT, CLUSTER = TESTS / "unit", TESTS / "cluster"
SERVER_FIXTURES = frozenset({"pg_url", "redis_url", "throwaway_redis", "throwaway_postgres",
                             "slow_provider"})
PROCESS_STARTERS = frozenset({"subprocess", "multiprocessing", "tests.harness.procs"})


def _needs_a_server(item: pytest.Item) -> list[str]:
    """The server fixtures `item` asks for and the process starters its module uses."""
    module = getattr(item, "module", None)
    names = vars(module).values() if module is not None else ()
    uses = ({getattr(value, "__module__", None) for value in names}
            | {value.__name__ for value in names if isinstance(value, types.ModuleType)})
    return sorted(SERVER_FIXTURES & set(getattr(item, "fixturenames", ()))) + sorted(
        PROCESS_STARTERS & uses)


# tests/unit/ mirrors the code: a folder for each room of quotaflow/ (its subfolders for
# a room's own parts, as providers/local/), for api/, cli/, workers/, mock_provider/ and
# quotaflow_client/, and project/ for the repository's own rules (layout, docs, deploy files).
_CODE = TESTS.parent / "quotaflow"
UNIT_FOLDERS = frozenset(
    {p.stem for p in _CODE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    | {"api", "cli", "workers", "mock_provider", "quotaflow_client", "project"}) - {"__init__"}


def _unit_folder(item: pytest.Item) -> str | None:
    parts = item.path.relative_to(UNIT).parts
    return parts[0] if len(parts) > 1 and parts[0] in UNIT_FOLDERS else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(CLUSTER):
            item.add_marker(pytest.mark.cluster)
        elif item.path.is_relative_to(UNIT):
            if _unit_folder(item) is None:
                raise pytest.UsageError(
                    f"{item.nodeid}: a unit test lives in the folder of the room it tests, "
                    f"tests/unit/<room>/ (one of {', '.join(sorted(UNIT_FOLDERS))})")
            if needs := _needs_a_server(item):
                raise pytest.UsageError(
                    f"{item.nodeid} uses {', '.join(needs)}: a test that needs a server or "
                    "starts processes belongs in tests/cluster/")
        elif item.path.is_relative_to(TESTS):
            raise pytest.UsageError(f"{item.nodeid}: a test lives in tests/unit/ (no server) "
                                    "or tests/cluster/")


def pytest_terminal_summary(terminalreporter) -> None:
    """The reliability tables, when fault tests ran (tests/harness/chaos_cluster.py,
    tests/harness/multihost_jobs.py)."""
    from tests.harness import chaos_cluster, multihost_jobs
    if chaos_cluster.ROWS:
        terminalreporter.write_sep("=", "reliability: faults during a job")
        terminalreporter.write_line(chaos_cluster.table())
    cells = [row.cells() for row in multihost_jobs.ROWS] + _MULTIHOST_CELLS
    if cells:
        terminalreporter.write_sep("=", "across hosts (tests/cluster/test_multihost.py)")
        terminalreporter.write_line(multihost_jobs.table_of_cells(cells))

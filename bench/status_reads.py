"""What one status read costs the API process, in process (no sockets, no clients): the
CPU of `GET /jobs/{id}` and `GET /v1/batches/{id}` through the whole ASGI app, answered
from the recent object by api/status_fast_path.py, and the same reads with that path off
(through FastAPI's routing and dependencies to the route); prints a markdown table.

    python -m bench.status_reads                 # 4,000 reads each way, three rounds
    python -m bench.status_reads --reads 20000 --rounds 5

CPU is this process's (time.process_time), so the figures hold on a machine busy with
other work, where wall-clock rates do not. It uses the database quotaflow_bench (dropped
and made again), or QUOTAFLOW_BENCH_DATABASE_URL; the per-key limit is off, one key.
"""

import argparse
import asyncio
import io
import os
import statistics
import time
from typing import Any

PG_URL = os.environ.get("QUOTAFLOW_BENCH_DATABASE_URL",
                        "postgresql+psycopg://postgres@127.0.0.1:5432/quotaflow_bench")
REDIS_URL = os.environ.get("QUOTAFLOW_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")


class Collect:
    def dispatch(self, queue: str, batches: list[Any]) -> None:
        """Nothing runs: the job stays as made."""


def _scope(path: str, key: str) -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(),
            "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 80), "state": {},
            "headers": [(b"host", b"127.0.0.1"), (b"authorization", f"Bearer {key}".encode())]}


async def _read(app: Any, path: str, key: str) -> int:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(_scope(path, key), receive, send)
    return int(sent[0]["status"])


async def _rounds(app: Any, fast_path: Any, job_id: str, key: str, reads: int,
                  rounds: int) -> dict[str, list[float]]:
    paths = (f"/jobs/{job_id}", f"/v1/batches/{job_id}")
    found: dict[str, list[float]] = {"fast path": [], "route": []}
    async with app.router.lifespan_context(app):
        for _ in range(rounds):
            for way in found:  # alternately, each round
                fast_path.enabled = way == "fast path"
                started = time.process_time()
                for n in range(reads):
                    status = await _read(app, paths[n % 2], key)
                    assert status == 200, status
                found[way].append((time.process_time() - started) / reads * 1e6)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from quotaflow.db import session_factory, upgrade
    from tests.harness.servers import recreate_database

    recreate_database(PG_URL)
    upgrade(PG_URL)
    os.environ.update(QUOTAFLOW_DATABASE_URL=PG_URL, QUOTAFLOW_BROKER_URL=REDIS_URL,
                      QUOTAFLOW_AUTH="true", QUOTAFLOW_API_RATE_LIMIT="off")
    from api.app import create_app
    from api.status_fast_path import StatusFastPath
    from quotaflow.config import get_settings
    from quotaflow.ingest import pipeline
    from quotaflow.tenants.keys import create_key
    from tests.harness.factories import chat_line, jsonl

    settings = get_settings()
    sessions = session_factory(PG_URL)
    key = create_key(sessions, "bench").secret
    job_id = pipeline.create_job_in_process(
        sessions, io.BytesIO(jsonl([chat_line(f"r{n}") for n in range(3)])),
        settings=settings, deployments=settings.load_deployments(), dispatcher=Collect(),
        queue="bulk", tenant="bench").id
    app = create_app()
    layer: Any = app.build_middleware_stack()
    app.middleware_stack = layer
    while not isinstance(layer, StatusFastPath):
        layer = layer.app
    found = asyncio.run(_rounds(app, layer, job_id, key, args.reads, args.rounds))
    print(f"\n{args.reads:,} reads a round, {args.rounds} rounds, alternately; CPU of this "
          f"process per read (QUOTAFLOW_API_STATUS_CACHE_S={settings.api_status_cache_s:g})\n")
    print("| path | CPU us per read (median) | each round |\n|---|---|---|")
    for way, figures in found.items():
        print(f"| {way} | {statistics.median(figures):,.0f} | "
              + " / ".join(f"{figure:,.0f}" for figure in figures) + " |")


if __name__ == "__main__":
    main()

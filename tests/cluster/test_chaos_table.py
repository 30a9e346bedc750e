"""Crash means resume, in seconds: the reliability table, one fault at a time.

Four workers on default settings, a strict mock provider (1,200 RPM enforced
over 10 s, 200 ms a call) and a 1,000-line job that needs about 45 s of budget.
At about 30% done one fault strikes; then every custom_id must come back exactly once, the provider
may have seen a request twice only if it was in flight at the crash (at most
IN_FLIGHT_BOUND), and the job must finish within RESUME_ALLOWANCE_S of the fault
ending plus the time its remaining lines need at the budget. While PostgreSQL
is away the API answers 503 with a message that says so.
"""

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.harness import chaos_cluster
from tests.harness.chaos_cluster import (
    IN_FLIGHT_BOUND,
    LINES,
    RESUME_ALLOWANCE_S,
    ROWS,
    RPM,
    ChaosCluster,
    Progress,
)
from tests.harness.cluster import job_status, one_result_per_line, output_ids

pytestmark = pytest.mark.timeout(300)


def _kill_worker(cluster: ChaosCluster, _job: Progress) -> None:
    os.killpg(cluster.workers[0].pid, signal.SIGKILL)


def _restart_redis(cluster: ChaosCluster, job: Progress) -> None:
    cluster.redis.stop()
    time.sleep(3)
    # Meanwhile the API still shows the job: its state lives in PostgreSQL
    shown = httpx.get(f"{cluster.api_url}/jobs/{job.job_id}", timeout=10)
    assert shown.status_code == 200, shown.text
    cluster.redis.start()


def _restart_postgres(stop: Callable[[], None], start: Callable[[], None]
                      ) -> Callable[[ChaosCluster, Progress], None]:
    def fault(cluster: ChaosCluster, job: Progress) -> None:
        stop()
        time.sleep(2)
        # Meanwhile the API answers 503 and says why, never a 500 or a hang
        shown = httpx.get(f"{cluster.api_url}/jobs/{job.job_id}", timeout=30)
        assert shown.status_code == 503, shown.text
        assert "database" in shown.text.lower(), shown.text
        time.sleep(3)
        start()
    return fault


def _run(cluster: ChaosCluster, name: str,
         fault: Callable[[ChaosCluster, Progress], None]) -> None:
    cluster.start()
    job = cluster.submit()
    cluster.wait_for(job, LINES * 3 // 10)
    fault(cluster, job)
    ended = time.monotonic()
    at_end = cluster.done(job)
    left = LINES - at_end
    resumed = None
    allowed = RESUME_ALLOWANCE_S + left / (RPM / 60)
    while (status := job_status(cluster.sessions, job.job_id)) == "in_progress":
        if resumed is None and cluster.done(job) > at_end:
            resumed = time.monotonic() - ended
        assert time.monotonic() - ended < allowed + 60, (
            f"{name}: {cluster.done(job)} of {LINES} done {time.monotonic() - ended:.0f} s "
            f"after the fault ended")
        time.sleep(0.1)
    finished = time.monotonic() - ended
    resumed = finished if resumed is None else resumed
    stats = cluster.provider_stats()
    results, lines = one_result_per_line(cluster.sessions, job.job_id)
    ids = output_ids(cluster.sessions, job.job_id)
    repeats = stats["duplicate_bodies"]  # calls of a body after its first
    ROWS.append((name, str(LINES - lines), str(results - lines + len(ids) - len(set(ids))),
                 str(repeats), str(stats["peak_in_flight"]), f"{resumed:.1f}",
                 f"{finished:.1f} ({allowed:.0f})"))
    print(chaos_cluster.table())
    assert status == "completed"
    assert (results, lines) == (LINES, LINES)
    assert ids == [f"c{i}" for i in range(LINES)]
    assert repeats <= IN_FLIGHT_BOUND, json.dumps(stats)
    assert stats["rejected_429"] == 0, json.dumps(stats)
    assert finished <= allowed, f"{name}: finished {finished:.1f} s after, allowed {allowed:.0f}"


def test_a_worker_killed_outright(tmp_path: Path, throwaway_postgres) -> None:
    cluster = ChaosCluster(tmp_path, throwaway_postgres[0])
    try:
        _run(cluster, "kill -9 a worker", _kill_worker)
    finally:
        cluster.stop()


@pytest.mark.parametrize("aof", [True, False], ids=["aof", "empty"])
def test_redis_restarted(tmp_path: Path, throwaway_postgres, aof: bool) -> None:
    cluster = ChaosCluster(tmp_path, throwaway_postgres[0], aof=aof)
    try:
        _run(cluster, f"Redis restart ({'AOF' if aof else 'empty'})", _restart_redis)
    finally:
        cluster.stop()


def test_postgres_restarted(tmp_path: Path, throwaway_postgres) -> None:
    url, start, stop = throwaway_postgres
    cluster = ChaosCluster(tmp_path, url)
    try:
        _run(cluster, "PostgreSQL restart", _restart_postgres(stop, start))
    finally:
        cluster.stop()

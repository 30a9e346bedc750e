"""Caps inside the shared budget (issue 49, part 2), on a real cluster: four workers,
four strict mock providers (they give back unused max_tokens or keep them, per minute or
per second: tests/harness/cap_cluster.py), real Redis and PostgreSQL.

Tenant "capped" (--rpm 60) and tenant "free" share each deployment of 300 RPM. Counted
from each provider's record of what it received: no window holds more of the capped
tenant's requests than its token bucket admits, no provider answers 429, and the uncapped
tenant takes most of the rest of a per-second budget (the fair share does not hold it to
the capped tenant's pace).

With the tenant's cap left out (`capped=False`), the capped tenant takes about half of
each budget and this test fails. A second test runs a job of `quotaflow run --max-rpm`
(the in-process limiter) against a provider with room for more: the provider's record
shows the job's cap held.
"""

import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.harness.cap_cluster import (
    CAP_RPM,
    MODES,
    RPM,
    CapCluster,
    bound,
    most_in_a_window,
    received,
)
from tests.harness.cluster import start_provider
from tests.harness.factories import chat_line, write_jsonl
from tests.harness.procs import quotaflow
from tests.harness.servers import REDIS_URL, ROOT, flush_redis, service_env

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(150)]

MEASURE_S = 12.0
# A request admitted at t reaches the provider a little later, its neighbours too: one
# more request in a window than the bucket admits is arrival jitter, not a breach.
JITTER = 1


def test_a_capped_tenant_never_exceeds_its_cap_and_the_others_share_the_rest(
        pg_url: str, tmp_path: Path) -> None:
    flush_redis(REDIS_URL)
    cluster = CapCluster(tmp_path, pg_url, REDIS_URL)
    try:
        started = time.monotonic()
        cluster.start()
        print(f"cluster started in {time.monotonic() - started:.1f} s")
        cluster.run(MEASURE_S)
        seen = {mode: cluster.received(mode) for mode in MODES}
        rejected = {mode: cluster.rejected_429(mode) for mode in MODES}
    finally:
        cluster.stop()
    for mode, (burst_s, _) in MODES.items():
        window_s = 5.0 if burst_s < 60 else 10.0
        got = {tag: most_in_a_window(times, window_s) for tag, times in seen[mode].items()}
        spans = {tag: round(times[-1] - times[0], 1) for tag, times in seen[mode].items()}
        print(f"{mode}: most per {window_s:g} s window {got}, spans {spans}, "
              f"429s {rejected[mode]}")
        assert rejected[mode] == 0, mode
        assert got.get("capped", 0) <= bound(CAP_RPM, burst_s, window_s) + JITTER, (mode, got)
        if burst_s < 60:
            # Per second, a cap is what holds them back: they reach it.
            assert got.get("capped", 0) >= bound(CAP_RPM, burst_s, window_s) / 2, (mode, got)
            # The rest of the budget (300 - 60 RPM) goes mostly to the uncapped tenant.
            free = seen[mode]["free"]
            rate = len(free) / (free[-1] - free[0])
            assert rate >= 0.6 * (RPM - CAP_RPM) / 60, (mode, rate)


JOB_RPM = 120  # 2 a second; a bucket of 2 at a 1 s burst
JOB_LINES = 24


def test_a_jobs_max_rpm_holds_it_below_a_roomier_deployment(tmp_path: Path) -> None:
    # Given a strict provider of 300 RPM per second, and a job of `quotaflow run` capped
    # at 120 RPM (the in-process limiter: one process)
    provider, url = start_provider(tmp_path, "--rpm", str(RPM), "--tpm", "100000000",
                                   "--burst-seconds", "1", "--latency-ms", "20",
                                   "--record", str(tmp_path / "record.jsonl"))
    try:
        deployments = tmp_path / "deployments.toml"
        deployments.write_text(f'[deployments.strict]\nprovider = "openai"\n'
                               f'base_url = "{url}/v1"\nmodel = "strict"\nrpm = {RPM}\n'
                               'tpm = 100000000\nburst_seconds = 1\n[routes]\n'
                               '"*" = "strict"\n')
        write_jsonl(tmp_path / "in.jsonl", [chat_line(f"j{i}", prompt=f"job question {i}")
                                            for i in range(JOB_LINES)])
        env = service_env(QUOTAFLOW_DATABASE_URL=f"sqlite:///{tmp_path / 'run.db'}",
                          QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments))
        # When it runs
        done = subprocess.run(quotaflow("run", str(tmp_path / "in.jsonl"), "-o",
                                        str(tmp_path / "out.jsonl"), "--max-rpm",
                                        str(JOB_RPM), "--concurrency", "4", "--quiet"),
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        rejected = int(httpx.get(f"{url}/stats", timeout=10).json()["rejected_429"])
    finally:
        provider.stop()
    assert done.returncode == 0, done.stderr
    # Then the provider saw at most what a bucket of 120 RPM admits, in every window
    times = received(tmp_path / "record.jsonl")["job"]
    most = most_in_a_window(times, 3.0)
    print(f"job: {len(times)} requests in {times[-1] - times[0]:.1f} s, most per 3 s {most}")
    assert len(times) == JOB_LINES and rejected == 0
    assert most <= bound(JOB_RPM, 1.0, 3.0) + JITTER, most
    assert times[-1] - times[0] >= (JOB_LINES - 2) / (JOB_RPM / 60) - 1.0

"""Mixed provider faults: every item ends succeeded or failed with its reason, and none twice."""

import json
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from quotaflow.config import Settings
from quotaflow.models import Result
from quotaflow.results import output as downloads
from tests.harness.cluster import deployment_file, start_provider, start_workers, submit_and_finish
from tests.harness.factories import chat_line
from tests.harness.servers import REDIS_URL, flush_redis, service_env

ITEMS = 2000
ATTEMPTS = 5
FAULTS = ("429=0.005", "500=0.06", "reset=0.03", "hang=0.01", "malformed=0.03")

pytestmark = pytest.mark.timeout(300)


def test_a_job_under_mixed_faults_loses_nothing(pg_url: str, pg_sessions, tmp_path: Path) -> None:
    # Given a provider that fails about 13% of requests in every way providers fail (on the
    # realtime queue: after each 429 a bulk job would first wait for its 20% floor to refill)
    flush_redis(REDIS_URL)
    fault_args = [arg for fault in FAULTS for arg in ("--fault", fault)]
    procs = []
    try:
        provider, provider_url = start_provider(tmp_path, "--rpm", "600000", "--tpm",
                                                "100000000", "--latency-ms", "5", *fault_args)
        procs.append(provider)
        # (a run of 10 failures in a row, which would open the circuit, is not among
        # the faults studied here; tests/cluster/test_routing_cluster.py covers circuits)
        deployments = deployment_file(tmp_path, "flaky", provider_url,
                                      "timeout_s = 1\nmax_concurrency = 100\n"
                                      "circuit_failures = 10\n")
        env = service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                          QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments),
                          QUOTAFLOW_PROVIDER_MAX_ATTEMPTS=str(ATTEMPTS))
        procs += start_workers(env, tmp_path, "faults")
        settings = Settings(database_url=pg_url, broker_url=REDIS_URL, batch_size=100,
                            deployments_file=deployments, _env_file=None)
        # When the job runs to its end
        view = submit_and_finish(pg_sessions, settings,
                                 [chat_line(f"f{i}") for i in range(ITEMS)], timeout=240)
        job_id = view["id"]
        stats = httpx.get(f"{provider_url}/stats").json()
    finally:
        for proc in reversed(procs):
            proc.stop()
    # Then every line has exactly one result: a success, or a failure that says why
    assert view["status"] == "completed"
    counts = view["request_counts"]
    assert counts["completed"] + counts["failed"] == ITEMS
    assert counts["completed"] >= ITEMS * 0.99
    with pg_sessions() as session:
        per_line = session.execute(select(func.count(), func.count(func.distinct(Result.line_no)))
                                   .where(Result.job_id == job_id)).one()
        errors = [json.loads(line) for line in downloads.iter_output(session, job_id, errors=True)]
        output = [json.loads(line) for line in downloads.iter_output(session, job_id, errors=False)]
    assert per_line == (ITEMS, ITEMS)
    assert sorted(line["custom_id"] for line in output + errors) == sorted(
        f"f{i}" for i in range(ITEMS))
    for error in errors:
        assert f"gave up after {ATTEMPTS} attempts" in error["error"]["message"]
    # And every kind of fault happened, yet no request was sent more often than retries allow
    assert set(stats["faults"]) == {"429", "500", "reset", "hang", "malformed"}
    assert stats["max_calls_per_body"] <= ATTEMPTS

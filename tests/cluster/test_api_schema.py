"""Schemathesis against the OpenAPI schema of the running API: whatever it sends to any
route, with a valid key or without, the answer is never a server error (5xx), its status
is one the schema documents for that route, with the documented content type and body.
(That no key gives 401 is tests/cluster/test_tenants.py's job; the generator also sends other
methods.)

`test_every_check_passes` runs `st run --checks all` (every phase: coverage, fuzzing and
stateful sequences, valid and invalid data) with the settings of schemathesis.toml beside
this file: the schema states every rule the server enforces, the few a generator cannot
read from it are supplied by tests/harness/schema_hooks.py."""

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests.harness.openai_cluster import V1Cluster, start_cluster
from tests.harness.servers import ROOT

CONFIG = Path(__file__).with_name("schemathesis.toml")
# DELETE /jobs/{id} deletes a job's results and keeps the job, a tombstone (`deleted: true`)
# that GET /jobs/{id} still answers. (A schemathesis.toml setting per operation does not
# reach the stateful phase, which checks with the run's settings.)
EXCLUDED = ("--exclude-checks", "use_after_free")
# Cases per operation and phase: about a minute on two cores, every phase included.
ST_EXAMPLES = 15


@pytest.fixture(scope="module")
def cluster(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[V1Cluster]:
    # No workers: created jobs only wait in the queue, which is all this test needs. The
    # webhooks' key is set, so that POST /webhooks answers what it would in production, and
    # loopback is allowed, the one address a webhook can be sent to here (no DNS).
    yield from start_cluster(pg_url, tmp_path_factory.mktemp("schema"), workers=0,
                             QUOTAFLOW_WEBHOOK_SECRET_KEY="schema-test-webhook-key-0123456789ab",
                             QUOTAFLOW_WEBHOOK_ALLOWED_NETWORKS="127.0.0.0/8")


@pytest.fixture(scope="module")
def api_schema(cluster: V1Cluster) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(f"{cluster.api_url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")
# POST /jobs/jsonl's body is a file's bytes, sent as they are.
schemathesis.serializer.alias("application/jsonl", "application/octet-stream")
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]


@schema.parametrize()
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                 HealthCheck.function_scoped_fixture])
def test_no_request_makes_the_api_fail(case: schemathesis.Case, cluster: V1Cluster) -> None:
    for headers in (cluster.headers("team-a"), {}):
        response = case.call(base_url=cluster.api_url, headers=headers, timeout=30)
        assert response.status_code < 500, (
            f"{case.method} {case.formatted_path} -> {response.status_code}: "
            f"{response.text[:500]}\n{cluster.procs['api'].log()[-3000:]}")
        case.validate_response(response, checks=CHECKS)


# Values the generator rarely hits that once made the API fail: PostgreSQL holds no NUL in
# text or JSONB, so ids, cursors, metadata and lines with one must be refused as 4xx.
HOSTILE = [
    ("GET", "/v1/batches/%00", {}),
    ("POST", "/v1/batches/%00/cancel", {}),
    ("GET", "/v1/files/%00", {}),
    ("GET", "/v1/files/file-out-%00/content", {}),
    ("DELETE", "/v1/files/%00", {}),
    ("GET", "/v1/batches?after=%00", {}),
    ("GET", "/v1/files?after=%00", {}),
    ("GET", "/v1/files?purpose=%00", {}),
    ("GET", "/jobs?after=%00", {}),
    ("GET", "/jobs/%00", {}),
    ("POST", "/v1/batches", {"json": {"input_file_id": "file-\u0000",
                                      "endpoint": "/v1/chat/completions"}}),
    ("POST", "/v1/batches", {"json": {"input_file_id": "file-x", "endpoint": "/v1/embeddings",
                                      "metadata": {"k": "\u0000"}}}),
    ("POST", "/jobs", {"files": {"file": ("a.jsonl", b'{"prompt": "x"}\n')},
                       "data": {"metadata": '{"a": "\\u0000"}'}}),
    ("POST", "/jobs", {"files": {"file": ("a.jsonl",
                                          b'{"custom_id": "a\\u0000", "prompt": "x"}\n')}}),
    ("POST", "/v1/files", {"files": {"file": ("a.jsonl", b"{}\n")}, "data": {"purpose": "\x00"}}),
    ("GET", "/v1/messages/batches/%00", {}),
    ("GET", "/v1/messages/batches?after_id=%00", {}),
    ("POST", "/v1/messages/batches", {"json": {"requests": [{"custom_id": "a\u0000",
                                                             "params": {}}]}}),
    # A key the walk of the body refuses, written as JSON escapes of a character past Latin-1.
    ("POST", "/v1/messages/batches", {"content": b'{"\\ud950\\udf3c": 1, "requests": []}',
                                      "headers": {"Content-Type": "application/json"}}),
    ("POST", "/v1/messages/batches", {"json": {"requests": [{"custom_id": "a", "params": {
        "model": "m\u0000", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}}]}}),
]


@pytest.mark.parametrize(("method", "path", "kwargs"), HOSTILE)
def test_nul_characters_are_client_errors(cluster: V1Cluster, method: str, path: str,
                                          kwargs: dict) -> None:
    headers = {**cluster.headers("team-a"), **kwargs.pop("headers", {})}
    response = httpx.request(method, cluster.api_url + path, headers=headers, timeout=30,
                             **kwargs)
    assert 400 <= response.status_code < 500, response.text


def test_every_check_passes(cluster: V1Cluster) -> None:
    """Schemathesis' every check against the running API finds nothing: no server error,
    no answer the schema does not describe, no valid request refused and no invalid one
    accepted, every 405 with its `Allow`."""
    # An operator key (GET /limits too) of a tenant of its own: other modules' tests on
    # this database list team-a's keys and expect none of them to be an operator's.
    key = cluster.create_key("schema-ops", "--operator")
    env = {**cluster.env, "PYTHONPATH": str(ROOT), "QF_SCHEMA_API_URL": cluster.api_url,
           "QF_SCHEMA_API_KEY": key}
    run = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "--config-file", str(CONFIG), "run",
         f"{cluster.api_url}/openapi.json", "--checks", "all", *EXCLUDED, "--workers", "2",
         "--max-examples", str(ST_EXAMPLES), "--seed", "1", "--no-shrink",
         "--header", f"Authorization: Bearer {key}"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, (run.stdout[-12000:] + run.stderr[-3000:]
                                 + cluster.procs["api"].log()[-3000:])

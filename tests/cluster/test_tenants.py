"""API keys and tenants on the real API process: no key or a wrong one is a 401, another
tenant's batches, files and jobs are 404, lists show only one's own, keys are stored
only as digests, and the CLI authenticates with QUOTAFLOW_API_KEY."""

import hashlib
import json
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from sqlalchemy import text

from quotaflow.config import Settings
from quotaflow.db import get_engine
from tests.harness.factories import chat_line, jsonl
from tests.harness.openai_cluster import V1Cluster, start_cluster

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def cluster(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[V1Cluster]:
    # Tenants of its own: other modules leave their tenants' jobs in the same database.
    yield from start_cluster(pg_url, tmp_path_factory.mktemp("tenants"), workers=1,
                             tenants=("tn-a", "tn-b"))


def sdk(cluster: V1Cluster, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=cluster.base_url, api_key=cluster.keys[tenant], max_retries=0)


@pytest.fixture(scope="module")
def team_a_batch(cluster: V1Cluster) -> tuple[str, str]:
    """A finished batch of tn-a: (batch id, input file id)."""
    client = sdk(cluster, "tn-a")
    uploaded = client.files.create(file=("a.jsonl", jsonl([chat_line("a-1"), chat_line("a-2")])),
                                   purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT,
                                  completion_window="24h")
    assert cluster.wait_for_batch("tn-a", batch.id)["status"] == "completed"
    return batch.id, uploaded.id


def test_no_key_or_a_wrong_key_is_401_everywhere_but_healthz(cluster: V1Cluster) -> None:
    for method, path in (("GET", "/v1/files"), ("GET", "/v1/batches"), ("GET", "/jobs"),
                         ("GET", "/v1/batches/batch_x"), ("POST", "/v1/batches/batch_x/cancel"),
                         ("GET", "/limits"), ("GET", "/jobs/batch_x/results")):
        for headers in ({}, {"Authorization": "Bearer qf-wrong"},
                        {"Authorization": f"Basic {cluster.keys['tn-a']}"}):
            response = httpx.request(method, cluster.api_url + path, headers=headers)
            assert response.status_code == 401, (method, path, headers, response.text)
            assert response.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{cluster.api_url}/healthz").status_code == 200
    wrong = openai.OpenAI(base_url=cluster.base_url, api_key="qf-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="incorrect API key"):
        wrong.batches.list()
    with pytest.raises(openai.AuthenticationError):
        wrong.files.create(file=("x.jsonl", jsonl([chat_line("x")])), purpose="batch")


def test_another_tenants_batch_and_files_are_404(cluster: V1Cluster,
                                                  team_a_batch: tuple[str, str]) -> None:
    batch_id, file_id = team_a_batch
    own = sdk(cluster, "tn-a").batches.retrieve(batch_id)
    assert own.output_file_id  # tn-a sees its batch and its output
    other = sdk(cluster, "tn-b")
    for call in (lambda: other.batches.retrieve(batch_id),
                 lambda: other.batches.cancel(batch_id),
                 lambda: other.files.retrieve(file_id),
                 lambda: other.files.content(file_id).read(),
                 lambda: other.files.delete(file_id),
                 lambda: other.files.retrieve(own.output_file_id),
                 lambda: other.files.content(own.output_file_id).read(),
                 lambda: other.batches.create(input_file_id=file_id, endpoint=CHAT,
                                              completion_window="24h")):
        with pytest.raises(openai.NotFoundError) as missing:
            call()
        assert "a-1" not in str(missing.value.body)
    headers = cluster.headers("tn-b")
    for method, path in (("GET", f"/jobs/{batch_id}"), ("GET", f"/jobs/{batch_id}/results"),
                         ("GET", f"/jobs/{batch_id}/errors"), ("POST", f"/jobs/{batch_id}/cancel"),
                         ("POST", f"/jobs/{batch_id}/retry")):
        response = httpx.request(method, cluster.api_url + path, headers=headers)
        assert response.status_code == 404, (method, path, response.text)
        assert "a-1" not in response.text
    # and tn-a's batch and file are untouched
    assert sdk(cluster, "tn-a").files.retrieve(file_id).id == file_id
    assert sdk(cluster, "tn-a").batches.retrieve(batch_id).status == "completed"


def test_lists_show_only_ones_own(cluster: V1Cluster, team_a_batch: tuple[str, str]) -> None:
    batch_id, file_id = team_a_batch
    b = sdk(cluster, "tn-b")
    uploaded = b.files.create(file=("b.jsonl", jsonl([chat_line("b-1")])), purpose="batch")
    created = b.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h")
    assert [x.id for x in b.batches.list()] == [created.id]
    assert [f.id for f in b.files.list()] == [uploaded.id]
    jobs = httpx.get(f"{cluster.api_url}/jobs", headers=cluster.headers("tn-b")).json()["data"]
    assert [job["id"] for job in jobs] == [created.id]
    a = sdk(cluster, "tn-a")
    assert batch_id in [x.id for x in a.batches.list()]
    assert created.id not in [x.id for x in a.batches.list()]
    assert file_id in [f.id for f in a.files.list()]
    assert uploaded.id not in [f.id for f in a.files.list()]
    # a page cursor from another tenant is not a way in either
    with pytest.raises(openai.NotFoundError):
        a.batches.list(after=created.id)


def test_keys_are_stored_as_digests_and_can_be_revoked(cluster: V1Cluster, pg_url: str) -> None:
    key = cluster.create_key("tn-c")
    client = openai.OpenAI(base_url=cluster.base_url, api_key=key, max_retries=0)
    assert client.batches.list().data == []
    with get_engine(pg_url).connect() as conn:
        dump = "".join(str(row) for table in ("api_keys", "tenants", "jobs", "files")
                       for row in conn.execute(text(f"SELECT * FROM {table}")))
    assert key not in dump and hashlib.sha256(key.encode()).hexdigest() in dump
    for proc in cluster.procs.values():
        assert key not in proc.log_path.read_text(errors="replace")
    listed = cluster.cli("keys", "list")
    assert "tn-c" in listed.stdout and key not in listed.stdout
    key_id = next(line.split()[0] for line in listed.stdout.splitlines() if " tn-c " in line)
    assert cluster.cli("keys", "revoke", key_id).returncode == 0
    # The API remembers an accepted key for QUOTAFLOW_API_KEY_CACHE_S (5 s by default).
    deadline = time.monotonic() + Settings(_env_file=None).api_key_cache_s + 2
    with pytest.raises(openai.AuthenticationError):
        while time.monotonic() < deadline:
            client.batches.list()
            time.sleep(0.2)


def test_cli_sends_quotaflow_api_key(cluster: V1Cluster, team_a_batch: tuple[str, str]) -> None:
    batch_id, _ = team_a_batch
    with_key = {**cluster.env, "QUOTAFLOW_API_KEY": cluster.keys["tn-a"]}
    shown = cluster.cli("status", batch_id, "--json", env=with_key)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["status"] == "completed"
    results = cluster.cli("results", batch_id, env=with_key)
    assert [json.loads(line)["custom_id"] for line in results.stdout.splitlines()] == ["a-1", "a-2"]
    other = cluster.cli("status", batch_id,
                        env={**cluster.env, "QUOTAFLOW_API_KEY": cluster.keys["tn-b"]})
    assert other.returncode == 1 and f"no job with id '{batch_id}'" in other.stderr
    without = cluster.cli("status", batch_id)
    assert without.returncode == 1 and "QUOTAFLOW_API_KEY" in without.stderr
    bad_tenant = cluster.cli("keys", "create", "--tenant", "no spaces")
    assert bad_tenant.returncode == 2 and "tenant name 'no spaces' is not allowed" in (
        bad_tenant.stderr)


def test_keys_create_sets_the_tenants_fair_share_weight(cluster: V1Cluster, pg_url: str) -> None:
    made = cluster.cli("keys", "create", "--tenant", "tn-w", "--weight", "3")
    assert made.returncode == 0, made.stderr
    with get_engine(pg_url).connect() as conn:
        weights = dict(conn.execute(text("SELECT name, weight FROM tenants")).all())
    assert weights["tn-w"] == 3 and weights["tn-a"] == 1  # equal unless set
    assert cluster.cli("keys", "create", "--tenant", "tn-w", "--weight", "0").returncode == 2


def test_keys_create_and_keys_tenant_set_and_clear_the_tenants_caps(cluster: V1Cluster,
                                                                      pg_url: str) -> None:
    made = cluster.cli("keys", "create", "--tenant", "tn-c", "--rpm", "600", "--tpm", "90000")
    assert made.returncode == 0, made.stderr

    def caps() -> tuple[int | None, int | None]:
        with get_engine(pg_url).connect() as conn:
            return tuple(conn.execute(text("SELECT max_rpm, max_tpm FROM tenants "
                                           "WHERE name = 'tn-c'")).one())

    assert caps() == (600, 90000)
    changed = cluster.cli("keys", "tenant", "tn-c", "--rpm", "60")
    assert changed.returncode == 0 and "rpm cap 60, tpm cap unchanged" in changed.stdout
    assert caps() == (60, 90000)
    assert cluster.cli("keys", "tenant", "tn-c", "--no-caps").returncode == 0
    assert caps() == (None, None)
    assert cluster.cli("keys", "create", "--tenant", "tn-c", "--rpm", "0").returncode == 2

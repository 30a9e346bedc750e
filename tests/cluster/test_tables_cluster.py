"""Tables against a real API, worker and mock provider (issue 50): `quotaflow submit` of
a Parquet table through a template and `quotaflow results -o out.parquet|csv` joining
the answers to its rows; `quotaflow run` of a CSV to a Parquet table; and the Python
client over HTTP: submit rows, wait, results, jobs.list, cancel, retry, errors as
quotaflow's exception classes."""

import csv
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quotaflow import Client
from quotaflow.errors import JobStateError, NotFound, RowError
from tests.harness.cluster import deployment_file, start_provider
from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import REDIS_URL, flush_redis, service_env

pytestmark = pytest.mark.timeout(300)


@dataclass
class Cluster:
    env: dict[str, str]
    api_url: str
    workdir: Path

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(quotaflow(*args), env=self.env, capture_output=True, text=True,
                              timeout=120, cwd=self.workdir)

    def client(self) -> Client:
        return Client(self.api_url)


@pytest.fixture(scope="module")
def cluster(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    flush_redis(REDIS_URL)
    workdir = tmp_path_factory.mktemp("tables")
    provider, provider_url = start_provider(workdir, "--rpm", "600000", "--tpm", "100000000")
    deployments = deployment_file(workdir, "fast", provider_url)
    api_port = free_port()
    env = service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                      QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments), QUOTAFLOW_AUTH="false",
                      QUOTAFLOW_API_URL=f"http://127.0.0.1:{api_port}",
                      QUOTAFLOW_PROGRESS_INTERVAL_S="0.5")
    procs = [provider, Proc("api", quotaflow("api", "--port", str(api_port)), env, workdir),
             Proc("worker", quotaflow("worker", "--concurrency", "2", "--name",
                                      "tables@qftest"), env, workdir)]
    try:
        procs[1].wait_http(f"http://127.0.0.1:{api_port}/healthz")
        procs[2].wait_until(lambda: "tables@qftest ready." in procs[2].log(100_000))
        yield Cluster(env, f"http://127.0.0.1:{api_port}", workdir)
    finally:
        for proc in reversed(procs):
            proc.stop()


def test_a_parquet_table_submitted_and_its_answers_joined_back(cluster: Cluster) -> None:
    table = cluster.workdir / "reviews.parquet"
    ids = [f"r{i:03d}" for i in range(40)]
    pq.write_table(pa.table({"review_id": ids, "text": [f"review {i}" for i in range(40)],
                             "stars": list(range(40))}), table, row_group_size=16)
    (cluster.workdir / "prompt.j2").write_text("Rate: {{ text }} ({{ stars }} stars)")
    submitted = cluster.cli("submit", str(table), "--template", "prompt.j2", "--model", "fast",
                            "--max-tokens", "16", "--id-column", "review_id", "--json")
    assert submitted.returncode == 0, submitted.stderr
    job = json.loads(submitted.stdout)
    assert job["request_counts"]["total"] == 40 and job["metadata"]["quotaflow_input"]
    # no terminal: the upload's progress as plain lines, in lines sent
    assert f"{job['id']} stored: 40/40 (100.0%), " in submitted.stderr, submitted.stderr
    assert " lines/s" in submitted.stderr and "\x1b" not in submitted.stderr
    watched = cluster.cli("status", job["id"], "--watch", "--quiet")
    assert watched.returncode == 0, watched.stderr
    got = cluster.cli("results", job["id"], "-o", "out.parquet")  # rows found by metadata
    assert got.returncode == 0, got.stderr
    out = pq.read_table(cluster.workdir / "out.parquet")
    assert out.column_names == ["review_id", "text", "stars", "custom_id", "response_text",
                                "response_json", "prompt_tokens", "completion_tokens",
                                "finish_reason", "error"]
    rows = out.to_pylist()
    assert [r["review_id"] for r in rows] == ids and [r["stars"] for r in rows] == list(
        range(40))
    assert rows[7]["response_text"] == "simulated reply to: Rate: review 7 (7 stars)"
    assert all(r["error"] is None and r["completion_tokens"] > 0 for r in rows)
    as_csv = cluster.cli("results", job["id"], "-o", "out.csv", "--input", str(table))
    assert as_csv.returncode == 0, as_csv.stderr
    with (cluster.workdir / "out.csv").open(newline="") as handle:
        assert [r["review_id"] for r in csv.DictReader(handle)] == ids
    assert f"{job['id']} rows: 40/40 (100.0%)" in got.stderr, got.stderr
    plain = cluster.cli("results", job["id"])  # JSONL as before, lines received on stderr
    assert [json.loads(line)["custom_id"] for line in plain.stdout.splitlines()] == ids
    assert f"{job['id']} results: 40/40 (100.0%), " in plain.stderr, plain.stderr
    quiet = cluster.cli("errors", job["id"], "--quiet")
    assert (quiet.returncode, quiet.stdout, quiet.stderr) == (0, "", "")


def test_a_failing_row_submits_nothing(cluster: Cluster) -> None:
    table = cluster.workdir / "typo.csv"
    table.write_text("text\nfine\n" + "also fine\n" * 5 + "\n")
    (cluster.workdir / "typo.j2").write_text("{{ text }}{{ summary }}")
    before = cluster.cli("jobs", "--json")
    refused = cluster.cli("submit", str(table), "--template", "typo.j2")
    assert refused.returncode == 2
    assert "error: row 1, column 'summary': typo.j2 uses 'summary'" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert cluster.cli("jobs", "--json").stdout == before.stdout


def test_the_client_over_http(cluster: Cluster) -> None:
    with cluster.client() as client:
        rows = [{"city": c, "n": i} for i, c in enumerate(["Oslo", "Lima", "Pune"], 1)]
        job = client.submit(rows, template="Weather in {{ city }}", queue="realtime",
                            metadata={"team": "geo"})
        assert job.data["metadata"] == {"team": "geo"} and job.data["queue"] == "realtime"
        assert job.wait(progress=True).status == "completed"
        answered = list(job.results())
        assert [(r["city"], r["n"], r["response_text"]) for r in answered] == [
            (c, i, f"simulated reply to: Weather in {c}")
            for i, c in enumerate(["Oslo", "Lima", "Pune"], 1)]
        assert job.id in [listed.id for listed in client.jobs.list(limit=5)]
        assert job.retry() == 0
        with pytest.raises(JobStateError):
            job.cancel()
        with pytest.raises(RowError, match="row 2, column 'city'"):
            client.submit([{"city": "x"}, {"town": "y"}], template="{{ city }}")
        with pytest.raises(NotFound, match="no job with id"):
            client.jobs.get("batch_00000000000000000000000000000000")


def test_run_a_csv_to_a_parquet_table(tmp_path: Path) -> None:
    (tmp_path / "cities.csv").write_text("id,city\nc1,Oslo\nc2,Lima\nc3,Pune\n")
    (tmp_path / "prompt.j2").write_text("Weather in {{ city }}")
    (tmp_path / "schema.json").write_text('{"type": "object", "properties": {}}')
    env = service_env(QUOTAFLOW_DATABASE_URL=f"sqlite:///{tmp_path / 'embedded.db'}")
    result = subprocess.run(
        quotaflow("run", "cities.csv", "--template", "prompt.j2", "--id-column", "id",
                  "--system", "Be brief.", "--response-format", "schema.json",
                  "-o", "out.parquet"),
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    rows = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert [(r["id"], r["city"], r["custom_id"], r["response_text"]) for r in rows] == [
        ("c1", "Oslo", "c1", "simulated reply to: Weather in Oslo"),
        ("c2", "Lima", "c2", "simulated reply to: Weather in Lima"),
        ("c3", "Pune", "c3", "simulated reply to: Weather in Pune")]
    assert not (tmp_path / "out.errors.jsonl").exists()


def test_a_jsonl_file_of_requests_gets_its_answers_as_a_table(cluster: Cluster) -> None:
    requests = cluster.workdir / "requests.jsonl"
    requests.write_text("".join(json.dumps(
        {"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "fast", "messages": [{"role": "user", "content": f"hi {i}"}]}})
        + "\n" for i in range(5)))
    submitted = cluster.cli("submit", str(requests), "--json")
    assert submitted.returncode == 0, submitted.stderr
    job = json.loads(submitted.stdout)
    assert cluster.cli("status", job["id"], "--watch", "--quiet").returncode == 0
    unknown = cluster.cli("results", job["id"], "-o", "plain.parquet")
    assert unknown.returncode == 2 and "give --input TABLE" in unknown.stderr
    got = cluster.cli("results", job["id"], "-o", "plain.parquet", "--input", str(requests),
                      "--id-column", "custom_id")
    assert got.returncode == 0, got.stderr
    rows = pq.read_table(cluster.workdir / "plain.parquet").to_pylist()
    assert [(r["custom_id"], r["body"]["messages"][0]["content"], r["response_text"])
            for r in rows] == [(f"q{i}", f"hi {i}", f"simulated reply to: hi {i}")
                               for i in range(5)]

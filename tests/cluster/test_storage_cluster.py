"""Object storage in and out (issue 50), against moto's S3 server and a real API, worker
and mock provider: a JSONL file of requests submitted from s3://, a Parquet table with
a template from s3://, results written to s3:// as JSONL, Parquet and CSV and read back;
`quotaflow run` from and to s3://; and the refusals (a missing object, no credentials,
an unknown scheme), each a message naming the path with nothing submitted."""

import csv
import io
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.harness.cluster import deployment_file, start_provider
from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.s3_server import BUCKET, s3_env, s3_server
from tests.harness.servers import REDIS_URL, flush_redis, service_env

pytestmark = pytest.mark.timeout(300)


@dataclass
class Cluster:
    env: dict[str, str]
    workdir: Path
    s3: Any

    def cli(self, *args: str, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(quotaflow(*args), env=env or self.env, capture_output=True,
                              text=True, timeout=120, cwd=self.workdir)

    def put(self, key: str, body: bytes) -> str:
        self.s3.put_object(Bucket=BUCKET, Key=key, Body=body)
        return f"s3://{BUCKET}/{key}"

    def get(self, key: str) -> bytes:
        body: bytes = self.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        return body

    def object_keys(self) -> set[str]:
        listed = self.s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])
        return {item["Key"] for item in listed}

    def job_ids(self) -> list[str]:
        listed = self.cli("jobs", "--json")
        return [job["id"] for job in json.loads(listed.stdout)]


@pytest.fixture(scope="module")
def cluster(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    flush_redis(REDIS_URL)
    workdir = tmp_path_factory.mktemp("storage")
    with s3_server() as endpoint:
        provider, provider_url = start_provider(workdir, "--rpm", "600000", "--tpm",
                                                "100000000")
        deployments = deployment_file(workdir, "fast", provider_url)
        api_port = free_port()
        env = service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                          QUOTAFLOW_DEPLOYMENTS_FILE=str(deployments), QUOTAFLOW_AUTH="false",
                          QUOTAFLOW_API_URL=f"http://127.0.0.1:{api_port}",
                          QUOTAFLOW_PROGRESS_INTERVAL_S="0.5", **s3_env(endpoint))
        procs = [provider, Proc("api", quotaflow("api", "--port", str(api_port)), env, workdir),
                 Proc("worker", quotaflow("worker", "--concurrency", "2", "--name",
                                          "storage@qftest"), env, workdir)]
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
        try:
            procs[1].wait_http(f"http://127.0.0.1:{api_port}/healthz")
            procs[2].wait_until(lambda: "storage@qftest ready." in procs[2].log(100_000))
            yield Cluster(env, workdir, s3)
        finally:
            for proc in reversed(procs):
                proc.stop()


def _requests(count: int) -> bytes:
    return "".join(json.dumps(
        {"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "fast", "messages": [{"role": "user", "content": f"hi {i}"}]}})
        + "\n" for i in range(count)).encode()


def _parquet(table: pa.Table) -> bytes:
    out = io.BytesIO()
    pq.write_table(table, out, row_group_size=16)
    return out.getvalue()


def test_a_jsonl_file_from_s3_and_its_results_to_s3(cluster: Cluster) -> None:
    url = cluster.put("in/requests.jsonl", _requests(30))
    submitted = cluster.cli("submit", url, "--json")
    assert submitted.returncode == 0, submitted.stderr
    job = json.loads(submitted.stdout)
    assert job["request_counts"]["total"] == 30
    assert cluster.cli("status", job["id"], "--watch", "--quiet").returncode == 0
    got = cluster.cli("results", job["id"], "-o", f"s3://{BUCKET}/out/results.jsonl")
    assert got.returncode == 0, got.stderr
    lines = [json.loads(line) for line in cluster.get("out/results.jsonl").splitlines()]
    assert [line["custom_id"] for line in lines] == [f"q{i}" for i in range(30)]
    assert lines[4]["response"]["body"]["choices"][0]["message"]["content"] == (
        "simulated reply to: hi 4")
    assert "testing" not in got.stderr + submitted.stderr  # no credential is ever shown


def test_a_parquet_table_from_s3_with_a_template_answers_to_s3(cluster: Cluster) -> None:
    ids = [f"r{i:03d}" for i in range(40)]
    url = cluster.put("in/reviews.parquet", _parquet(pa.table(
        {"review_id": ids, "text": [f"review {i}" for i in range(40)],
         "stars": list(range(40))})))
    (cluster.workdir / "prompt.j2").write_text("Rate: {{ text }} ({{ stars }} stars)")
    submitted = cluster.cli("submit", url, "--template", "prompt.j2", "--model", "fast",
                            "--id-column", "review_id", "--json")
    assert submitted.returncode == 0, submitted.stderr
    job = json.loads(submitted.stdout)
    assert job["metadata"]["quotaflow_input"] == url and job["request_counts"]["total"] == 40
    assert cluster.cli("status", job["id"], "--watch", "--quiet").returncode == 0
    got = cluster.cli("results", job["id"], "-o", f"s3://{BUCKET}/out/answers.parquet")
    assert got.returncode == 0, got.stderr  # the rows found again in s3 by the metadata
    rows = pq.read_table(io.BytesIO(cluster.get("out/answers.parquet"))).to_pylist()
    assert [r["review_id"] for r in rows] == ids and [r["stars"] for r in rows] == list(
        range(40))
    assert rows[7]["response_text"] == "simulated reply to: Rate: review 7 (7 stars)"
    as_csv = cluster.cli("results", job["id"], "-o", f"s3://{BUCKET}/out/answers.csv")
    assert as_csv.returncode == 0, as_csv.stderr
    read = list(csv.DictReader(io.StringIO(cluster.get("out/answers.csv").decode())))
    assert [r["review_id"] for r in read] == ids
    # a table out that cannot be joined (another table) leaves no object behind
    other = cluster.put("in/other.parquet", _parquet(pa.table({"review_id": ["x"],
                                                               "text": ["y"]})))
    wrong = cluster.cli("results", job["id"], "-o", f"s3://{BUCKET}/out/wrong.parquet",
                        "--input", other)
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr, wrong.stderr
    assert "out/wrong.parquet" not in cluster.object_keys()


def test_run_from_s3_to_s3(cluster: Cluster, tmp_path: Path) -> None:
    url = cluster.put("in/cities.csv", b"id,city\nc1,Oslo\nc2,Lima\n")
    (tmp_path / "prompt.j2").write_text("Weather in {{ city }}")
    env = cluster.env | {"QUOTAFLOW_DATABASE_URL": f"sqlite:///{tmp_path / 'e.db'}"}
    ran = subprocess.run(quotaflow("run", url, "--template", "prompt.j2", "--id-column", "id",
                                   "-o", f"s3://{BUCKET}/out/run.parquet", "--quiet"),
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    rows = pq.read_table(io.BytesIO(cluster.get("out/run.parquet"))).to_pylist()
    assert [(r["id"], r["response_text"]) for r in rows] == [
        ("c1", "simulated reply to: Weather in Oslo"),
        ("c2", "simulated reply to: Weather in Lima")]


@pytest.mark.parametrize(("args", "message"), [
    (("submit", f"s3://{BUCKET}/in/missing.jsonl"),
     f"error: s3://{BUCKET}/in/missing.jsonl: no such object"),
    (("submit", f"s3://{BUCKET}/in/missing.parquet", "--template", "prompt.j2"),
     f"error: s3://{BUCKET}/in/missing.parquet: no such object"),
    (("submit", "s3://no-such-bucket-here/x.jsonl"),
     "error: s3://no-such-bucket-here/x.jsonl: no such object (or no such bucket)"),
    (("submit", "ftp://example/x.jsonl"),
     "ftp://example/x.jsonl: quotaflow reads local paths and s3://, gs:// and az:// URLs, "
     "not ftp://"),
])
def test_an_unusable_path_is_named_and_nothing_submitted(cluster: Cluster, args: tuple[str, ...],
                                                         message: str) -> None:
    (cluster.workdir / "prompt.j2").write_text("{{ text }}")
    before = cluster.job_ids()
    refused = cluster.cli(*args)
    assert refused.returncode == 2, refused.stderr
    assert message in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
    assert cluster.job_ids() == before


def test_no_credentials_is_said_with_the_path(cluster: Cluster) -> None:
    url = cluster.put("in/creds.jsonl", _requests(2))
    env = {k: v for k, v in cluster.env.items() if not k.startswith(("AWS_ACCESS",
                                                                      "AWS_SECRET"))}
    env |= {"AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent"}
    before = cluster.job_ids()
    refused = cluster.cli("submit", url, env=env)
    assert refused.returncode == 2, refused.stderr
    assert f"cannot read {url}: access denied or no credentials" in refused.stderr
    assert "Traceback" not in refused.stderr and cluster.job_ids() == before


def test_generate_then_judge_through_the_api(cluster: Cluster) -> None:
    url = cluster.put("in/facts.parquet", _parquet(pa.table(
        {"key": ["k1", "k2", "k3"], "city": ["Oslo", "Lima", "Pune"]})))
    (cluster.workdir / "fact.j2").write_text("A fact about {{ city }}")
    (cluster.workdir / "judge.j2").write_text("Judge ({{ city }}): {{ response_text }}")
    first = json.loads(cluster.cli("submit", url, "--template", "fact.j2", "--model", "fast",
                                   "--id-column", "key", "--json").stdout)
    running = cluster.cli("submit", "--after", first["id"], "--template", "judge.j2")
    if running.returncode != 0:  # refused while the first stage runs, nothing submitted
        assert f"job {first['id']} is " in running.stderr and "Traceback" not in running.stderr
    assert cluster.cli("status", first["id"], "--watch", "--quiet").returncode == 0
    submitted = cluster.cli("submit", "--after", first["id"], "--template", "judge.j2",
                            "--model", "fast", "--json")
    assert submitted.returncode == 0, submitted.stderr
    second = json.loads(submitted.stdout)
    assert second["metadata"]["quotaflow_after"] == first["id"]
    assert cluster.cli("status", second["id"], "--watch", "--quiet").returncode == 0
    got = cluster.cli("results", second["id"], "-o", f"s3://{BUCKET}/out/judged.parquet")
    assert got.returncode == 0, got.stderr
    rows = pq.read_table(io.BytesIO(cluster.get("out/judged.parquet"))).to_pylist()
    assert [(r["key"], r["custom_id"], r["response_text"], r["previous_response_text"])
            for r in rows] == [
        (k, k, f"simulated reply to: Judge ({c}): simulated reply to: A fact about {c}",
         f"simulated reply to: A fact about {c}")
        for k, c in (("k1", "Oslo"), ("k2", "Lima"), ("k3", "Pune"))]

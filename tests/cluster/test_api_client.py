"""A client generated from the API's OpenAPI document (openapi-python-client, at test
time) makes a job and reads it back as the document's types: the document is enough to
write a working client, and the answers parse as the models it declares."""

import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from io import BytesIO
from pathlib import Path
from types import ModuleType

import pytest

from tests.harness.openai_cluster import V1Cluster, start_cluster

PACKAGE = "qf_generated_client"
LINES = b"".join(
    json.dumps({"custom_id": f"c{n}", "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": "fast-model",
                         "messages": [{"role": "user", "content": f"hi {n}"}]}}).encode()
    + b"\n" for n in range(2))


@pytest.fixture(scope="module")
def cluster(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[V1Cluster]:
    # No workers: the job waits in its queue, which is all a read needs.
    yield from start_cluster(pg_url, tmp_path_factory.mktemp("client"), workers=0)


def generate(cluster: V1Cluster, into: Path) -> ModuleType:
    """The client package generated from the running API's document, imported."""
    config = into / "config.yaml"
    config.write_text(f"project_name_override: {PACKAGE}\npackage_name_override: {PACKAGE}\n"
                      "post_hooks: []\n")
    made = subprocess.run(
        [sys.executable, "-m", "openapi_python_client", "generate",
         "--url", f"{cluster.api_url}/openapi.json", "--config", str(config),
         "--meta", "none", "--output-path", str(into / PACKAGE)],
        capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stdout + made.stderr
    sys.path.insert(0, str(into))
    try:
        return importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(into))


def test_a_generated_client_creates_and_reads_a_job(cluster: V1Cluster,
                                                   tmp_path: Path) -> None:
    client_package = generate(cluster, tmp_path)
    api = importlib.import_module(f"{PACKAGE}.api.jobs")
    models = importlib.import_module(f"{PACKAGE}.models")
    types = importlib.import_module(f"{PACKAGE}.types")
    for name in ("create_job_jobs_post", "get_job_jobs_job_id_get", "list_jobs_jobs_get"):
        importlib.import_module(f"{api.__name__}.{name}")
    client = client_package.AuthenticatedClient(base_url=cluster.api_url,
                                                token=cluster.keys["team-a"])
    body = models.BodyCreateJobJobsPost(
        file=types.File(payload=BytesIO(LINES), file_name="lines.jsonl"),
        queue=models.BodyCreateJobJobsPostQueueType0.BULK,
        metadata=json.dumps({"owner": "generated"}))

    with client:
        made = api.create_job_jobs_post.sync_detailed(client=client, body=body)
        assert made.status_code == 201, made.content
        job = made.parsed
        assert isinstance(job, models.Job)
        assert job.object_ == "batch" and job.queue == "bulk"
        assert job.request_counts.total == 2 and job.request_counts.pending == 2
        assert job.metadata.additional_properties == {"owner": "generated"}

        read = api.get_job_jobs_job_id_get.sync(client=client, job_id=job.id)
        assert isinstance(read, models.Job)
        assert (read.id, read.status, read.input_filename) == (job.id, job.status, "lines.jsonl")
        assert read.to_dict() == job.to_dict()

        page = api.list_jobs_jobs_get.sync(client=client)
        assert isinstance(page, models.JobList)
        assert [listed.id for listed in page.data] == [job.id]

"""The official `openai` SDK, unchanged, against a running quotaflow: files, batches,
output and error files, cancelling mid-run, validation errors and the token quota."""

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from sqlalchemy import text

from quotaflow.db import get_engine
from tests.harness.factories import chat_line, jsonl, write_jsonl
from tests.harness.openai_cluster import FINAL, UPLOAD_LIMIT, V1Cluster, start_cluster
from tests.harness.servers import ROOT


@pytest.fixture(scope="module")
def cluster(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[V1Cluster]:
    yield from start_cluster(pg_url, tmp_path_factory.mktemp("v1sdk"))


def sdk(cluster: V1Cluster, tenant: str = "team-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=cluster.base_url, api_key=cluster.keys[tenant], max_retries=0)


def poll(client: openai.OpenAI, batch_id: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while (batch := client.batches.retrieve(batch_id)).status not in FINAL:
        assert time.monotonic() < deadline, f"{batch_id} still {batch.status}"
        time.sleep(0.3)
    return batch


def test_upload_run_and_download_with_the_openai_sdk(cluster: V1Cluster) -> None:
    client = sdk(cluster)
    # Given a file of 40 good requests and one whose body is invalid (line 21)
    lines: list[dict | str] = [chat_line(f"q-{i}", f"tell me about tide {i}") for i in range(40)]
    lines.insert(20, {"custom_id": "bad-1", "method": "POST", "url": "/v1/chat/completions",
                      "body": {"model": "gpt-4o-mini"}})
    path = write_jsonl(cluster.workdir / "sdk.jsonl", lines)
    # When it is uploaded, run as a batch and polled with the SDK
    uploaded = client.files.create(file=path, purpose="batch")
    assert uploaded.id.startswith("file-") and uploaded.object == "file"
    assert uploaded.bytes == path.stat().st_size and uploaded.status == "processed"
    assert uploaded.filename == "sdk.jsonl" and uploaded.purpose == "batch"
    assert client.files.retrieve(uploaded.id).bytes == uploaded.bytes
    assert client.files.content(uploaded.id).read() == path.read_bytes()
    assert uploaded.id in [f.id for f in client.files.list()]
    created = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                    completion_window="24h",
                                    metadata={"quotaflow_queue": "realtime", "run": "sdk"})
    assert created.id.startswith("batch_") and created.input_file_id == uploaded.id
    assert created.status in ("validating", "in_progress")
    assert created.model_extra["queue"] == "realtime"
    batch = poll(client, created.id)
    # Then it completes: 40 succeeded, the invalid line failed with its line number
    assert batch.status == "completed", batch
    assert batch.request_counts.total == 41
    assert batch.request_counts.completed == 40 and batch.request_counts.failed == 1
    assert batch.completed_at and batch.in_progress_at and batch.finalizing_at
    assert batch.metadata == {"quotaflow_queue": "realtime", "run": "sdk"}
    assert batch.usage.input_tokens > 0 and batch.usage.output_tokens > 0
    assert [(e.line, e.code) for e in batch.errors.data] == [(21, "invalid_request")]
    assert "body.messages" in batch.errors.data[0].message
    # And the output file has each good custom_id once, answering its own prompt
    output = [json.loads(line) for line in
              client.files.content(batch.output_file_id).text.splitlines()]
    assert [line["custom_id"] for line in output] == [f"q-{i}" for i in range(40)]
    for line in output:
        assert line["response"]["status_code"] == 200 and line["error"] is None
        reply = line["response"]["body"]["choices"][0]["message"]["content"]
        assert reply == f"simulated reply to: tell me about tide {line['custom_id'][2:]}"
    errors = [json.loads(line) for line in
              client.files.content(batch.error_file_id).text.splitlines()]
    assert [(e["custom_id"], e["error"]["line"]) for e in errors] == [("bad-1", 21)]
    output_file = client.files.retrieve(batch.output_file_id)
    assert output_file.purpose == "batch_output"
    assert output_file.bytes == len(client.files.content(batch.output_file_id).read())
    assert created.id in [b.id for b in client.batches.list()]


def test_cancel_mid_run_gives_cancelled_with_partial_output(cluster: V1Cluster) -> None:
    client = sdk(cluster)
    # Given a batch of 400 requests on a slow provider (300 ms a request)
    path = write_jsonl(cluster.workdir / "slow.jsonl",
                       [chat_line(f"s-{i}", model="slow") for i in range(400)])
    uploaded = client.files.create(file=path, purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    deadline = time.monotonic() + 60
    while client.batches.retrieve(batch.id).request_counts.completed == 0:
        assert time.monotonic() < deadline, "no request finished within 60 s"
        time.sleep(0.2)
    # When it is cancelled while it runs
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    assert cancelling.cancelling_at is not None
    batch = poll(client, batch.id, timeout=60)
    # Then it ends `cancelled`, with the finished requests in its output file
    assert batch.status == "cancelled" and batch.cancelled_at is not None
    done = batch.request_counts.completed
    assert 0 < done < 400
    output = client.files.content(batch.output_file_id).text.splitlines()
    errors = [json.loads(line) for line in client.files.content(batch.error_file_id).text
              .splitlines()]
    assert len(output) == done
    assert {e["error"]["code"] for e in errors} <= {"batch_cancelled"}
    ids = [json.loads(line)["custom_id"] for line in output] + [e["custom_id"] for e in errors]
    assert sorted(ids) == sorted(f"s-{i}" for i in range(400))  # each exactly once
    assert client.batches.cancel(batch.id).status == "cancelled"  # again: no change


def test_invalid_file_gives_a_failed_batch_with_line_numbers(cluster: V1Cluster) -> None:
    client = sdk(cluster)
    bad = cluster.workdir / "bad.jsonl"
    bad.write_bytes(b'{not json\n{"custom_id": "x", "method": "GET", "url": "/v1/chat/completions"'
                    b', "body": {}}\n')
    uploaded = client.files.create(file=bad, purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    assert batch.status == "failed" and batch.failed_at is not None
    assert [e.line for e in batch.errors.data] == [1, 2]
    assert "not valid JSON" in batch.errors.data[0].message
    assert 'method must be "POST"' in batch.errors.data[1].message
    assert batch.output_file_id is None and batch.error_file_id is None
    # A file whose lines are for another endpoint fails the same way
    other = write_jsonl(cluster.workdir / "emb.jsonl", [
        {"custom_id": "e1", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "m", "input": "hi"}}])
    uploaded = client.files.create(file=other, purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    assert batch.status == "failed" and [e.line for e in batch.errors.data] == [1]
    # A request that cannot be a batch at all is a 400, as at OpenAI
    with pytest.raises(openai.BadRequestError, match="endpoint '/v1/nope' is not supported"):
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/nope",
                              completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions",
                              completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="input_file_id"):
        client.batches.create(input_file_id="", endpoint="/v1/chat/completions",
                              completion_window="24h")


def test_enqueued_token_quota_rejects_a_batch_that_would_exceed_it(cluster: V1Cluster) -> None:
    # Given a tenant allowed 300 enqueued prompt tokens, and a slow batch holding most of them
    key = cluster.create_key("small", "--max-enqueued-tokens", "300")
    client = openai.OpenAI(base_url=cluster.base_url, api_key=key, max_retries=0)
    first = write_jsonl(cluster.workdir / "q1.jsonl",
                        [chat_line(f"a-{i}", "x" * 100, model="slow") for i in range(8)])
    uploaded = client.files.create(file=first, purpose="batch")  # ~8 x 26 tokens
    running = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                    completion_window="24h")
    assert running.status == "in_progress"
    # When another batch of ~130 tokens is sent while the first is unfinished
    second = write_jsonl(cluster.workdir / "q2.jsonl",
                         [chat_line(f"b-{i}", "y" * 100) for i in range(5)])
    uploaded = client.files.create(file=second, purpose="batch")
    # Then it is refused with the numbers, and no batch is made of it
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                              completion_window="24h")
    assert refused.value.code == "token_limit_exceeded"
    assert "enqueued token limit reached for tenant 'small'" in str(refused.value)
    assert "the limit is 300" in str(refused.value)
    assert [b.id for b in client.batches.list()] == [running.id]
    # And once the first batch is finished the same file is accepted
    assert poll(client, running.id).status == "completed"
    accepted = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                     completion_window="24h")
    assert poll(client, accepted.id).status == "completed"


def test_uploads_over_the_size_limit_are_refused_and_not_stored(cluster: V1Cluster) -> None:
    client = sdk(cluster, "team-b")
    before = [f.id for f in client.files.list()]
    line = json.dumps(chat_line("big", "z" * 5000)) + "\n"
    # Just over the limit: refused while it is copied to storage
    just_over = jsonl([line.strip()] * (UPLOAD_LIMIT // len(line) + 1))
    assert UPLOAD_LIMIT < len(just_over) < UPLOAD_LIMIT + 64 * 1024
    with pytest.raises(openai.APIStatusError) as refused:
        client.files.create(file=("over.jsonl", just_over), purpose="batch")
    assert refused.value.status_code == 413
    assert "QUOTAFLOW_MAX_UPLOAD_BYTES" in str(refused.value)
    # Far over: refused by the body limit before it is read
    with pytest.raises(openai.APIStatusError) as refused:
        client.files.create(file=("huge.jsonl", just_over * 3), purpose="batch")
    assert refused.value.status_code == 413
    assert [f.id for f in client.files.list()] == before
    with pytest.raises(openai.BadRequestError, match="purpose 'fine-tune' is not supported"):
        client.files.create(file=("x.jsonl", b"{}\n"), purpose="fine-tune")


def test_queue_header_and_file_deletion(cluster: V1Cluster, tmp_path: Path) -> None:
    client = sdk(cluster)
    path = write_jsonl(tmp_path / "q.jsonl", [chat_line("h-1")])
    uploaded = client.files.create(file=path, purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h",
                                  extra_headers={"X-Quotaflow-Queue": "bulk"})
    assert batch.model_extra["queue"] == "bulk"
    # the same job through the /jobs view
    job = httpx.get(f"{cluster.api_url}/jobs/{batch.id}", headers=cluster.headers("team-a"))
    assert job.json()["queue"] == "bulk"
    assert poll(client, batch.id).status == "completed"
    with pytest.raises(openai.ConflictError, match="can no longer be cancelled"):
        client.batches.cancel(batch.id)
    deleted = client.files.delete(uploaded.id)
    assert deleted.deleted and deleted.id == uploaded.id
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)
    # the batch made from it keeps its results
    assert len(client.files.content(client.batches.retrieve(batch.id).output_file_id)
               .text.splitlines()) == 1
    # and a job made through POST /jobs is a batch too
    made = httpx.post(f"{cluster.api_url}/jobs", headers=cluster.headers("team-a"),
                      files={"file": ("j.jsonl", jsonl([chat_line("j-1"), chat_line("j-2")]))},
                      data={"queue": "realtime"}).raise_for_status().json()
    seen = poll(client, made["id"])
    assert seen.status == "completed" and seen.request_counts.completed == 2
    assert seen.model_extra["queue"] == "realtime" and seen.input_file_id is None
    assert [json.loads(line)["custom_id"] for line in
            client.files.content(seen.output_file_id).text.splitlines()] == ["j-1", "j-2"]


def test_the_docs_snippet_runs_as_pasted(cluster: V1Cluster, tmp_path: Path) -> None:
    # Given the docs' SDK example (docs/api/openai.md), only pointed at this cluster's port
    page = (ROOT / "docs" / "api" / "openai.md").read_text()
    snippet = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    assert "http://127.0.0.1:8000/v1" in snippet
    script = tmp_path / "snippet.py"
    script.write_text(snippet.replace("http://127.0.0.1:8000", cluster.api_url)
                      + "print(batch.status, len(output.splitlines()), repr(errors))\n")
    write_jsonl(tmp_path / "prompts.jsonl", [chat_line(f"docs-{i}") for i in range(3)])
    # When it runs in a fresh interpreter, with the key in the environment
    ran = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120,
                         env={**cluster.env, "QUOTAFLOW_API_KEY": cluster.keys["team-a"]})
    # Then the batch completes and its output is read
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["completed", "3", "''"]


def test_expiry_policies_and_deletion_with_the_openai_sdk(cluster: V1Cluster,
                                                         tmp_path: Path) -> None:
    client = sdk(cluster)
    path = write_jsonl(tmp_path / "exp.jsonl", [chat_line(f"x-{i}") for i in range(3)])
    # An upload's expires_after, as the SDK sends it (expires_after[anchor], [seconds])
    uploaded = client.files.create(file=path, purpose="batch",
                                   expires_after={"anchor": "created_at", "seconds": 3600})
    assert uploaded.expires_at == uploaded.created_at + 3600
    assert client.files.retrieve(uploaded.id).expires_at == uploaded.expires_at
    plain = client.files.create(file=path, purpose="batch")  # QUOTAFLOW_FILE_RETENTION_S
    assert plain.expires_at == plain.created_at + 30 * 24 * 3600
    with pytest.raises(openai.BadRequestError, match="between 3600") as refused:
        client.files.create(file=path, purpose="batch",
                            expires_after={"anchor": "created_at", "seconds": 60})
    assert refused.value.param == "expires_after.seconds"
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                              completion_window="24h",
                              output_expires_after={"anchor": "created_at", "seconds": 10**9})
    assert refused.value.param == "output_expires_after.seconds"
    # A batch's output_expires_after: its files expire that long after they are made
    batch = poll(client, client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h",
        output_expires_after={"anchor": "created_at", "seconds": 7200}).id)
    assert batch.status == "completed"
    output_file = client.files.retrieve(batch.output_file_id)
    assert output_file.expires_at == output_file.created_at + 7200 == batch.completed_at + 7200
    assert batch.model_extra["output_expires_at"] == output_file.expires_at
    # Deleting its output file deletes its results; another tenant cannot
    with pytest.raises(openai.NotFoundError):
        sdk(cluster, "team-b").files.delete(batch.output_file_id)
    deleted = client.files.delete(batch.output_file_id)
    assert deleted.deleted and deleted.id == batch.output_file_id
    with pytest.raises(openai.NotFoundError):
        client.files.content(batch.output_file_id)
    tombstone = client.batches.retrieve(batch.id)
    assert tombstone.model_extra["deleted"] and tombstone.request_counts.completed == 3
    job = httpx.get(f"{cluster.api_url}/jobs/{batch.id}", headers=cluster.headers("team-a"))
    assert job.json()["deleted"] and job.json()["request_counts"]["completed"] == 3
    results = httpx.get(f"{cluster.api_url}/jobs/{batch.id}/results",
                        headers=cluster.headers("team-a"))
    assert results.status_code == 404 and "were deleted" in results.json()["error"]["message"]
    # And deleting the upload removes it
    assert client.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)


def test_a_running_job_is_cancelled_before_it_is_deleted(cluster: V1Cluster) -> None:
    headers = cluster.headers("team-a")
    made = httpx.post(f"{cluster.api_url}/jobs", headers=headers, files={"file": (
        "slow.jsonl", jsonl([chat_line(f"d-{i}", model="slow") for i in range(60)]))},
        data={"queue": "realtime"}).raise_for_status().json()
    job_url = f"{cluster.api_url}/jobs/{made['id']}"
    refused = httpx.delete(job_url, headers=headers)
    assert refused.status_code == 409 and "cancel it first" in refused.json()["error"]["message"]
    assert httpx.delete(job_url, headers=cluster.headers("team-b")).status_code == 404
    httpx.post(f"{job_url}/cancel", headers=headers).raise_for_status()
    assert poll(sdk(cluster), made["id"], timeout=60).status == "cancelled"
    # `quotaflow delete JOB`, as a user runs it
    ran = cluster.cli("delete", made["id"],
                      env={**cluster.env, "QUOTAFLOW_API_KEY": cluster.keys["team-a"]})
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == [made["id"], "cancelled", "deleted"]
    job = httpx.get(job_url, headers=headers).json()
    assert job["deleted"] and job["status"] == "cancelled"
    assert httpx.get(f"{job_url}/errors", headers=headers).status_code == 404


def test_the_workers_sweep_deletes_an_output_once_it_expires(cluster: V1Cluster, pg_url: str,
                                                              tmp_path: Path) -> None:
    client = sdk(cluster)
    path = write_jsonl(tmp_path / "sweep.jsonl", [chat_line(f"w-{i}") for i in range(4)])
    uploaded = client.files.create(file=path, purpose="batch")
    batch = poll(client, client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h",
        output_expires_after={"anchor": "created_at", "seconds": 3600}).id)
    assert len(client.files.content(batch.output_file_id).text.splitlines()) == 4
    # When its output is past its expiry (it ended two hours ago)
    with get_engine(pg_url).begin() as conn:
        conn.execute(text("UPDATE jobs SET completed_at = completed_at - interval '2 hours' "
                          "WHERE id = :id"), {"id": batch.id})
    # Then a worker's reaper round deletes it (every QUOTAFLOW_REAP_INTERVAL_S, 10 s)
    deadline = time.monotonic() + 40
    while not client.batches.retrieve(batch.id).model_extra["deleted"]:
        assert time.monotonic() < deadline, "no worker swept the expired output in 40 s"
        time.sleep(0.5)
    # and its rows go in the same round: marked deleted first (downloads refuse from
    # then on), purged right after in transactions of their own
    while True:
        with get_engine(pg_url).connect() as conn:
            left = conn.execute(text("SELECT count(*) FROM results WHERE job_id = :id"),
                                {"id": batch.id}).scalar()
        if left == 0:
            break
        assert time.monotonic() < deadline, f"{left} results still stored after the sweep"
        time.sleep(0.2)
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(batch.output_file_id)

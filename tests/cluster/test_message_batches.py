"""The official `anthropic` SDK, unchanged, against a running quotaflow's Message Batches
API (and the `openai` SDK's batch example on the same cluster): the API process, two
Celery workers, and the strict mock provider, whose /v1/messages serves the anthropic
deployment."""

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from anthropic.types.messages import MessageBatch

from tests.harness.factories import chat_line, write_jsonl
from tests.harness.openai_cluster import CLAUDE_MODEL, V1Cluster, start_cluster
from tests.harness.servers import ROOT

MAX_BYTES = 200_000
MAX_REQUESTS = 300


@pytest.fixture(scope="module")
def cluster(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[V1Cluster]:
    yield from start_cluster(pg_url, tmp_path_factory.mktemp("msgbatches"), anthropic=True,
                             tenants=("mb-a", "mb-b", "mb-c"),
                             QUOTAFLOW_MAX_MESSAGE_BATCH_BYTES=str(MAX_BYTES),
                             QUOTAFLOW_MAX_MESSAGE_BATCH_REQUESTS=str(MAX_REQUESTS))


def sdk(cluster: V1Cluster, tenant: str = "mb-a") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=cluster.api_url, api_key=cluster.keys[tenant],
                               max_retries=0)


def request(custom_id: str, text: str = "hello", model: str = CLAUDE_MODEL,
            **params: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "params": {
        "model": model, "max_tokens": 64,
        "messages": [{"role": "user", "content": text}], **params}}


def wait_ended(client: anthropic.Anthropic, batch_id: str, timeout: float = 120) -> MessageBatch:
    deadline = time.monotonic() + timeout
    while (batch := client.messages.batches.retrieve(batch_id)).processing_status != "ended":
        assert time.monotonic() < deadline, f"{batch_id} still {batch.processing_status}"
        time.sleep(0.3)
    return batch


def raw(cluster: V1Cluster, method: str, path: str, tenant: str | None = "mb-a",
        **kwargs: Any) -> httpx.Response:
    """A request with Anthropic's own headers: the key in x-api-key, anthropic-version."""
    headers = {"anthropic-version": "2023-06-01"}
    if tenant is not None:
        headers["x-api-key"] = cluster.keys[tenant]
    return httpx.request(method, f"{cluster.api_url}{path}", headers=headers, timeout=30,
                         **kwargs)


def assert_error(response: httpx.Response, status: int, kind: str, text: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert body == {"type": "error", "error": {"type": kind, "message": body["error"]["message"]}}
    assert text in body["error"]["message"], body


def test_the_anthropic_sdk_example_runs_unchanged(cluster: V1Cluster) -> None:
    # Given Anthropic's Message Batches example, pointed at quotaflow by the SDK's own
    # environment variables (its code names no URL and no key)
    env = {**cluster.env, "ANTHROPIC_BASE_URL": cluster.api_url,
           "ANTHROPIC_API_KEY": cluster.keys["mb-c"]}
    env.pop("ANTHROPIC_AUTH_TOKEN", None)
    # When it runs in a fresh interpreter
    ran = subprocess.run([sys.executable, str(ROOT / "examples" / "message_batches.py")],
                         env=env, capture_output=True, text=True, timeout=180)
    # Then it creates, polls, reads every result, lists, cancels and deletes
    assert ran.returncode == 0, ran.stderr
    out = ran.stdout.splitlines()
    assert out[0].startswith("created msgbatch_") and out[0].endswith(" in_progress")
    assert "ended 2 succeeded" in out
    assert sorted(line for line in out if line.startswith("Success!")) == [
        "Success! my-first-request: simulated reply to: Hello, world",
        "Success! my-second-request: simulated reply to: Hi again, friend"]
    assert "listed True" in out
    assert out[-2] in ("cancel canceling", "cancel ended")
    assert out[-1] == "deleted message_batch_deleted"
    # And the deleted batch is gone; the first one stays
    client = sdk(cluster, "mb-c")
    listed = list(client.messages.batches.list())
    assert [b.id for b in listed] == [out[0].split()[1]]


def test_create_poll_and_results_with_the_sdk(cluster: V1Cluster) -> None:
    client = sdk(cluster)
    # Given three good requests, one whose model an OpenAI-style deployment serves, and
    # one whose params Anthropic would refuse (no max_tokens)
    bad = request("bad-1")
    del bad["params"]["max_tokens"]
    requests = [request(f"r-{i}", f"question {i}") for i in range(3)]
    requests += [request("via-openai", "question 9", model="gpt-4o-mini"), bad]
    # When they are sent as a Message Batch
    created = client.messages.batches.create(requests=requests)
    # Then it is Anthropic's Message Batch object
    assert created.id.startswith("msgbatch_") and created.type == "message_batch"
    assert created.processing_status == "in_progress" and created.results_url is None
    assert created.request_counts.processing + created.request_counts.succeeded == 4
    assert created.request_counts.errored == 1  # refused at ingest, as a bad line
    assert created.ended_at is None and created.cancel_initiated_at is None
    assert (created.expires_at - created.created_at).total_seconds() == 24 * 3600
    batch = wait_ended(client, created.id)
    counts = batch.request_counts
    assert (counts.succeeded, counts.errored, counts.canceled, counts.expired,
            counts.processing) == (4, 1, 0, 0, 0)
    assert batch.ended_at is not None and batch.ended_at >= batch.created_at
    assert batch.results_url == f"{cluster.api_url}/v1/messages/batches/{batch.id}/results"
    # And its results stream every request once, in Anthropic's result shape
    results = {r.custom_id: r.result for r in client.messages.batches.results(batch.id)}
    assert set(results) == {"r-0", "r-1", "r-2", "via-openai", "bad-1"}
    for i in range(3):
        assert results[f"r-{i}"].type == "succeeded"
        assert results[f"r-{i}"].message.content[0].text == f"simulated reply to: question {i}"
        assert results[f"r-{i}"].message.model == CLAUDE_MODEL
    assert results["via-openai"].message.content[0].text == "simulated reply to: question 9"
    assert results["bad-1"].type == "errored"
    assert results["bad-1"].error.error.type == "invalid_request_error"
    assert "max_tokens" in results["bad-1"].error.error.message
    # The same job is a quotaflow job under its own id
    job = httpx.get(f"{cluster.api_url}/jobs/batch_{batch.id.removeprefix('msgbatch_')}",
                    headers=cluster.headers("mb-a")).raise_for_status().json()
    assert job["output_format"] == "anthropic" and job["request_counts"]["completed"] == 4


def test_lists_page_with_anthropic_cursors(cluster: V1Cluster) -> None:
    client = sdk(cluster, "mb-b")
    # Given five batches of mb-b (and an OpenAI batch of its own, which is no Message Batch)
    made = [client.messages.batches.create(requests=[request(f"l-{i}")]).id for i in range(5)]
    upload = openai.OpenAI(base_url=cluster.base_url, api_key=cluster.keys["mb-b"],
                           max_retries=0).files.create(
        file=("o.jsonl", json.dumps(chat_line("o-1")).encode()), purpose="batch")
    openai.OpenAI(base_url=cluster.base_url, api_key=cluster.keys["mb-b"]).batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    newest_first = made[::-1]
    # Then the SDK's auto-pagination walks them all, newest first, two to a page
    assert [b.id for b in client.messages.batches.list(limit=2)] == newest_first
    first = client.messages.batches.list(limit=2)
    assert [b.id for b in first.data] == newest_first[:2] and first.has_more
    assert (first.first_id, first.last_id) == tuple(newest_first[:2])
    # after_id pages towards older batches, before_id back towards newer ones
    second = client.messages.batches.list(limit=2, after_id=first.last_id)
    assert [b.id for b in second.data] == newest_first[2:4] and second.has_more
    last = client.messages.batches.list(limit=2, after_id=second.last_id)
    assert [b.id for b in last.data] == newest_first[4:] and not last.has_more
    back = client.messages.batches.list(limit=2, before_id=second.first_id)
    assert [b.id for b in back.data] == newest_first[:2] and not back.has_more
    back = client.messages.batches.list(limit=1, before_id=last.first_id)
    assert [b.id for b in back.data] == [newest_first[3]] and back.has_more
    assert [b.id for b in client.messages.batches.list(limit=2, before_id=second.first_id,
                                                       )] == newest_first[:2]
    # limit is 1..1000, answered as Anthropic answers a bad parameter
    for limit in (0, 1001):
        with pytest.raises(anthropic.BadRequestError, match="limit"):
            client.messages.batches.list(limit=limit)
    for batch_id in made:
        wait_ended(client, batch_id)


def test_a_tenant_sees_only_its_own_batches(cluster: V1Cluster) -> None:
    mine = sdk(cluster, "mb-a").messages.batches.create(requests=[request("t-1")])
    other = sdk(cluster, "mb-b")
    # Another tenant's key finds nothing by id, in lists or as a cursor
    for call in (other.messages.batches.retrieve, other.messages.batches.cancel,
                 other.messages.batches.delete):
        with pytest.raises(anthropic.NotFoundError, match="no message batch"):
            call(mine.id)
    assert mine.id not in [b.id for b in other.messages.batches.list()]
    assert_error(raw(cluster, "GET", f"/v1/messages/batches/{mine.id}/results", "mb-b"),
                 404, "not_found_error", "no message batch")
    with pytest.raises(anthropic.BadRequestError, match="after_id"):
        other.messages.batches.list(after_id=mine.id)
    # An OpenAI batch id, or a job whose output is OpenAI's, is no Message Batch either
    with pytest.raises(anthropic.NotFoundError):
        sdk(cluster).messages.batches.retrieve(mine.id.replace("msgbatch_", "batch_"))
    assert wait_ended(sdk(cluster), mine.id).request_counts.succeeded == 1


def test_refusals_are_anthropic_errors_and_store_nothing(cluster: V1Cluster) -> None:
    client = sdk(cluster, "mb-a")
    before = [b.id for b in client.messages.batches.list(limit=1000)]
    path = "/v1/messages/batches"
    # Duplicate custom_id, a custom_id off Anthropic's pattern, params that are no object
    with pytest.raises(anthropic.BadRequestError,
                       match=r"requests.2.custom_id: duplicate custom_id 'a' \(also requests.0"):
        client.messages.batches.create(requests=[request("a"), request("b"), request("a")])
    assert_error(raw(cluster, "POST", path, json={"requests": [request("a b")]}), 400,
                 "invalid_request_error", "requests.0.custom_id: String should match pattern")
    assert_error(raw(cluster, "POST", path, json={"requests": [{"custom_id": "a",
                                                                "params": [1]}]}),
                 400, "invalid_request_error", "requests.0.params")
    assert_error(raw(cluster, "POST", path, json={"requests": [request("a")], "x": 1}), 400,
                 "invalid_request_error", "x: Extra inputs are not permitted")
    for body, text in ((b"{", "not valid JSON"), (b"[]", "JSON object"),
                       (b'{"requests": []}', "at least 1 item"), (b"{}", "requests: Field")):
        assert_error(raw(cluster, "POST", path, content=body), 400, "invalid_request_error",
                     text)
    # Every request refused: the batch is, with the reasons per request
    refused = raw(cluster, "POST", path, json={"requests": [
        request("m-1", max_tokens=0), {"custom_id": "m-2", "params": {}}]})
    assert_error(refused, 400, "invalid_request_error", "no line of the file is a valid request; "
                 "requests.0: params.max_tokens must be a positive integer")
    assert "; requests.1: params.max_tokens" in refused.json()["error"]["message"]
    # Over Anthropic's limits (here QUOTAFLOW_MAX_MESSAGE_BATCH_REQUESTS and _BYTES)
    many = {"requests": [request(f"n-{i}") for i in range(MAX_REQUESTS + 1)]}
    assert len(json.dumps(many)) < MAX_BYTES
    assert_error(raw(cluster, "POST", path, json=many), 400, "invalid_request_error",
                 f"at most {MAX_REQUESTS} requests")
    with pytest.raises(anthropic.APIStatusError) as too_large:
        client.messages.batches.create(requests=[request("big", "x" * MAX_BYTES)])
    assert too_large.value.status_code == 413
    assert too_large.value.body["error"]["type"] == "request_too_large", too_large.value.body
    # Keys: none, or an unknown one, is Anthropic's authentication_error
    assert_error(raw(cluster, "GET", path, None), 401, "authentication_error", "x-api-key")
    assert_error(httpx.get(f"{cluster.api_url}{path}", headers={"x-api-key": "qf-nope"}),
                 401, "authentication_error", "incorrect API key")
    # No such batch, ids that cannot be one, routes that do not exist
    assert_error(raw(cluster, "GET", f"{path}/msgbatch_nope"), 404, "not_found_error",
                 "no message batch")
    assert_error(raw(cluster, "GET", f"{path}/%00"), 400, "invalid_request_error", "")
    assert_error(raw(cluster, "PUT", path), 405, "invalid_request_error", "")
    assert [b.id for b in client.messages.batches.list(limit=1000)] == before


def test_cancel_mid_run_results_and_delete(cluster: V1Cluster) -> None:
    client = sdk(cluster)
    # Given 40 requests on a slow deployment (300 ms each, two at a time)
    batch = client.messages.batches.create(
        requests=[request(f"s-{i}", f"slow {i}", model="slow") for i in range(40)],
        extra_headers={"X-Quotaflow-Queue": "realtime"})
    # Results, and deleting, wait for the end; the SDK does not even ask before it
    with pytest.raises(anthropic.AnthropicError, match="No `results_url`"):
        client.messages.batches.results(batch.id)
    assert_error(raw(cluster, "GET", f"/v1/messages/batches/{batch.id}/results"), 400,
                 "invalid_request_error", "has not ended yet")
    with pytest.raises(anthropic.BadRequestError, match="cancel it"):
        client.messages.batches.delete(batch.id)
    deadline = time.monotonic() + 60
    while client.messages.batches.retrieve(batch.id).request_counts.succeeded == 0:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    # When it is cancelled while it runs
    canceling = client.messages.batches.cancel(batch.id)
    assert canceling.processing_status in ("canceling", "ended")
    assert canceling.cancel_initiated_at is not None
    ended = wait_ended(client, batch.id, timeout=60)
    # Then its finished requests succeeded, the rest were canceled, each once in the results
    counts = ended.request_counts
    assert counts.succeeded > 0 and counts.canceled > 0
    assert counts.succeeded + counts.canceled == 40 and counts.errored == counts.expired == 0
    results = list(client.messages.batches.results(batch.id))
    assert sorted(r.custom_id for r in results) == sorted(f"s-{i}" for i in range(40))
    assert sum(r.result.type == "canceled" for r in results) == counts.canceled
    assert client.messages.batches.cancel(batch.id).processing_status == "ended"  # no change
    # And deleting it removes it and its results
    deleted = client.messages.batches.delete(batch.id)
    assert (deleted.id, deleted.type) == (batch.id, "message_batch_deleted")
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve(batch.id)
    assert_error(raw(cluster, "GET", f"/v1/messages/batches/{batch.id}/results"), 404,
                 "not_found_error", "no message batch")
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.delete(batch.id)


def test_the_x_api_key_header_works_on_every_route(cluster: V1Cluster) -> None:
    # The SDK configured to send only x-api-key, as Anthropic's API expects
    client = anthropic.Anthropic(base_url=cluster.api_url, api_key=None, max_retries=0,
                                 default_headers={"x-api-key": cluster.keys["mb-a"]})
    batch = client.messages.batches.create(requests=[request("k-1")])
    assert wait_ended(client, batch.id).request_counts.succeeded == 1
    assert [r.custom_id for r in client.messages.batches.results(batch.id)] == ["k-1"]
    # and quotaflow's own routes take it too
    jobs = raw(cluster, "GET", "/jobs").raise_for_status().json()
    assert "batch_" + batch.id.removeprefix("msgbatch_") in [j["id"] for j in jobs["data"]]
    assert raw(cluster, "GET", "/v1/batches").status_code == 200


def test_the_openai_sdk_batch_example_runs_unchanged(cluster: V1Cluster,
                                                     tmp_path: Path) -> None:
    # Given OpenAI's Batch API example, pointed at quotaflow by the SDK's own environment
    # variables, and chat lines for an OpenAI-style and the anthropic deployment
    write_jsonl(tmp_path / "batchinput.jsonl",
                [chat_line("request-1", "tell me about tides"),
                 chat_line("request-2", "and about the moon", model=CLAUDE_MODEL)])
    env = {**cluster.env, "OPENAI_BASE_URL": cluster.base_url,
           "OPENAI_API_KEY": cluster.keys["mb-a"]}
    ran = subprocess.run([sys.executable, str(ROOT / "examples" / "openai_batch.py")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert ran.returncode == 0, ran.stderr
    lines = [json.loads(line) for line in ran.stdout.splitlines() if line.startswith("{")]
    replies = {line["custom_id"]: line["response"]["body"] for line in lines}
    assert replies["request-1"]["choices"][0]["message"]["content"] == (
        "simulated reply to: tell me about tides")
    # the anthropic deployment's Message, made over as a chat.completion
    assert replies["request-2"]["object"] == "chat.completion"
    assert replies["request-2"]["id"].startswith("msg_")
    assert replies["request-2"]["choices"][0]["message"]["content"] == (
        "simulated reply to: and about the moon")


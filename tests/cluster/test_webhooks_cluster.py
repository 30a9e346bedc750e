"""Webhooks on the real API and a real worker: a job's end reaches a real HTTP endpoint as
a Standard Webhooks event the library's verifier accepts with the secret shown at
creation, failed attempts are retried on the schedule until one is accepted, and every
attempt is listed through REST and the CLI. Bad input is a 400 that says why."""

import itertools
import time
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import text
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from quotaflow.db import get_engine
from tests.harness.factories import chat_line, jsonl
from tests.harness.openai_cluster import FINAL, V1Cluster, start_cluster
from tests.harness.webhook_receiver import Receiver

KEY = "test-webhook-master-key-0123456789abcdef"
SCHEDULE = "0,0.3,0.3,0.3,0.3"

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def cluster(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[V1Cluster]:
    with get_engine(pg_url).begin() as conn:
        conn.execute(text("TRUNCATE webhook_endpoints CASCADE"))
    yield from start_cluster(pg_url, tmp_path_factory.mktemp("webhooks"), workers=1,
                             QUOTAFLOW_WEBHOOK_SECRET_KEY=KEY,
                             QUOTAFLOW_WEBHOOK_ALLOWED_NETWORKS="127.0.0.0/8",
                             QUOTAFLOW_WEBHOOK_RETRY_SCHEDULE_S=SCHEDULE,
                             QUOTAFLOW_WEBHOOK_POLL_INTERVAL_S="0.2")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    made = Receiver()
    yield made
    made.close()


def run_job(cluster: V1Cluster, tenant: str, count: int = 2) -> dict:
    """A job of `count` lines through POST /jobs, once it has ended."""
    lines = [chat_line(f"{tenant}-{i}") for i in range(count)]
    job = httpx.post(f"{cluster.api_url}/jobs", headers=cluster.headers(tenant),
                     files={"file": ("in.jsonl", jsonl(lines))}, timeout=30)
    job_id = job.raise_for_status().json()["id"]
    deadline = time.monotonic() + 60
    while (view := httpx.get(f"{cluster.api_url}/jobs/{job_id}", headers=cluster.headers(tenant),
                             timeout=10).json())["status"] not in FINAL:
        assert time.monotonic() < deadline, view
        time.sleep(0.2)
    return view


def deliveries(cluster: V1Cluster, tenant: str, endpoint_id: str) -> list[dict]:
    return httpx.get(f"{cluster.api_url}/webhooks/{endpoint_id}/deliveries",
                     headers=cluster.headers(tenant), timeout=10).raise_for_status().json()["data"]


def remove(cluster: V1Cluster, tenant: str, endpoint_id: str) -> None:
    httpx.delete(f"{cluster.api_url}/webhooks/{endpoint_id}", headers=cluster.headers(tenant),
                 timeout=10).raise_for_status()


def test_a_job_end_is_an_event_the_librarys_verifier_accepts(
        cluster: V1Cluster, receiver: Receiver) -> None:
    # Given an endpoint registered with the CLI, which prints its secret once
    env = {**cluster.env, "QUOTAFLOW_API_KEY": cluster.keys["team-a"]}
    added = cluster.cli("webhooks", "add", receiver.url, "--events", "batch.completed", env=env)
    assert added.returncode == 0, added.stderr
    secret = added.stdout.strip()
    assert secret.startswith("whsec_") and "\n" not in secret
    endpoint_id = added.stderr.split()[1]
    listed = cluster.cli("webhooks", "list", env=env)
    assert endpoint_id in listed.stdout and receiver.url in listed.stdout
    assert secret not in listed.stdout + listed.stderr
    # When a job of team-a ends
    job = run_job(cluster, "team-a")
    assert job["status"] == "completed"
    [(headers, body)] = receiver.wait_for(1)
    # Then the event verifies with that secret, and with no other
    event = Webhook(secret).verify(body, headers)
    assert event["object"] == "event" and event["id"].startswith("evt_")
    assert event["type"] == "batch.completed"
    assert event["data"]["id"] == job["id"] and event["data"]["object"] == "batch"
    assert event["data"]["status"] == "completed"
    assert event["data"]["request_counts"]["completed"] == 2
    assert headers["webhook-id"].startswith("msg_")
    forged = Webhook("whsec_" + "QUJD" * 11)
    with pytest.raises(WebhookVerificationError):
        forged.verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(body.replace(b"completed", b"cancelled"), headers)
    # and another tenant neither sees nor removes the endpoint
    other = cluster.headers("team-b")
    assert httpx.get(f"{cluster.api_url}/webhooks", headers=other).json()["data"] == []
    for method, path in (("GET", f"/webhooks/{endpoint_id}"),
                         ("DELETE", f"/webhooks/{endpoint_id}"),
                         ("GET", f"/webhooks/{endpoint_id}/deliveries"),
                         ("GET", f"/webhooks/deliveries?endpoint={endpoint_id}")):
        assert httpx.request(method, cluster.api_url + path, headers=other).status_code == 404
    removed = cluster.cli("webhooks", "remove", endpoint_id, env=env)
    assert removed.returncode == 0, removed.stderr
    assert cluster.cli("webhooks", "list", env=env).stdout == ""


def test_failed_attempts_are_retried_until_one_is_accepted_and_all_are_listed(
        cluster: V1Cluster) -> None:
    receiver = Receiver(answers=(500, 500, 500, 200))
    try:
        # Given an endpoint that answers 500 three times, then 200
        made = httpx.post(f"{cluster.api_url}/webhooks", headers=cluster.headers("team-b"),
                          json={"url": receiver.url}, timeout=10)
        assert made.status_code == 201, made.text
        endpoint_id = made.json()["id"]
        assert made.json()["events"] == ["batch.completed", "batch.failed", "batch.expired",
                                         "batch.cancelled"]
        # When a job ends
        job = run_job(cluster, "team-b")
        requests = receiver.wait_for(4)
        deadline = time.monotonic() + 10
        while (rows := deliveries(cluster, "team-b", endpoint_id))[0]["status"] == "pending":
            assert time.monotonic() < deadline, rows
            time.sleep(0.2)
        time.sleep(1.5)  # a fifth attempt, if one were coming, would have come by now
        # Then the endpoint got four tries of one message, the last accepted
        assert len(receiver.requests) == 4
        assert len({headers["webhook-id"] for headers, _ in requests}) == 1
        assert len({body for _, body in requests}) == 1  # the same bytes on every attempt
        [delivery] = deliveries(cluster, "team-b", endpoint_id)
        assert delivery["status"] == "delivered" and delivery["job_id"] == job["id"]
        assert delivery["id"] == requests[0][0]["webhook-id"]
        assert [a["status_code"] for a in delivery["attempts"]] == [500, 500, 500, 200]
        assert [a["attempt"] for a in delivery["attempts"]] == [1, 2, 3, 4]
        times = [a["attempted_at"] for a in delivery["attempts"]]
        assert all(later - earlier >= 0.25 for earlier, later in itertools.pairwise(times))
        assert all(a["duration_ms"] >= 0 for a in delivery["attempts"])
        # and the CLI lists the same
        env = {**cluster.env, "QUOTAFLOW_API_KEY": cluster.keys["team-b"]}
        shown = cluster.cli("webhooks", "deliveries", "--endpoint", endpoint_id, env=env)
        assert shown.returncode == 0, shown.stderr
        assert f"{delivery['id']}  batch.completed" in shown.stdout
        assert "delivered" in shown.stdout and "4 attempts" in shown.stdout
        assert shown.stdout.count("  500  ") == 3 and shown.stdout.count("  200  ") == 1
        every = httpx.get(f"{cluster.api_url}/webhooks/deliveries",
                          headers=cluster.headers("team-b")).json()["data"]
        assert [row["id"] for row in every] == [delivery["id"]]
        remove(cluster, "team-b", endpoint_id)
    finally:
        receiver.close()


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"url": "http://127.0.0.1:9/x", "events": ["batch.done"]}, "events",
     "unknown event 'batch.done'"),
    ({"url": "http://127.0.0.1:9/x", "events": []}, "events", "events is empty"),
    ({"url": "http://169.254.169.254/latest"}, "url", "link-local address (a cloud metadata"),
    ({"url": "http://10.1.2.3/"}, "url", "10.1.2.3 is a private address"),
    ({"url": "http://[::1]:9/"}, "url", "::1 is a loopback address"),
    ({"url": "ftp://127.0.0.1/"}, "url", "scheme 'ftp' is not allowed"),
    ({"url": "not a url"}, "url", "printable ASCII"),
    ({"url": "http://127.0.0.1:9/\u0000"}, "url", "printable ASCII"),
    ({"url": "http://a:b@127.0.0.1:9/"}, "url", "user name or password"),
    ({"url": "http://no-such-host.invalid/"}, "url", "cannot be resolved"),
])
def test_bad_input_is_a_400_that_names_the_reason(cluster: V1Cluster, body: dict, param: str,
                                                  words: str) -> None:
    answer = httpx.post(f"{cluster.api_url}/webhooks", headers=cluster.headers("team-a"),
                        json=body, timeout=10)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_the_cli_says_what_is_wrong_without_a_traceback(cluster: V1Cluster) -> None:
    env = {**cluster.env, "QUOTAFLOW_API_KEY": cluster.keys["team-a"]}
    refused = cluster.cli("webhooks", "add", "http://127.0.0.1:9/x", "--events", "batch.ended",
                          env=env)
    assert refused.returncode == 2  # invalid input (cli/exit_codes.py)
    assert "unknown event 'batch.ended'" in refused.stderr and "Traceback" not in refused.stderr
    missing = cluster.cli("webhooks", "deliveries", "--endpoint", "we_nope", env=env)
    assert missing.returncode == 1 and "no webhook endpoint" in missing.stderr

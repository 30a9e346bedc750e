"""POST /jobs/jsonl through the real API process: the file as the request body, its lines
stored while it arrives (api/body_stream.py). The job is the one a form makes; a refusal
names its lines; a body cut short stores nothing and leaves its Idempotency-Key free."""

import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest
from sqlalchemy import text

from quotaflow.db import get_engine
from tests.harness.factories import chat_line, jsonl
from tests.harness.openai_cluster import V1Cluster, start_cluster


@pytest.fixture(scope="module")
def cluster(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[V1Cluster]:
    # No workers: the jobs only need to be made.
    yield from start_cluster(pg_url, tmp_path_factory.mktemp("body"), tenants=("team-a",),
                             workers=0, QUOTAFLOW_MAX_LINES="5000",
                             QUOTAFLOW_MAX_FILE_BYTES=str(4 * 1024 * 1024))


def post_body(cluster: V1Cluster, data: bytes, key: str | None = None,
              **options: str) -> httpx.Response:
    headers = cluster.headers("team-a") | {"Content-Type": "application/jsonl"}
    return httpx.post(f"{cluster.api_url}/jobs/jsonl", content=data, params=options,
                      headers=headers | ({"Idempotency-Key": key} if key else {}), timeout=60)


def stored(pg_url: str, job_id: str) -> list[tuple]:
    with get_engine(pg_url).connect() as conn:
        return [tuple(row) for row in conn.execute(text(
            "SELECT line_no, custom_id, body::text, status FROM items WHERE job_id = :j "
            "ORDER BY line_no"), {"j": job_id})]


def test_a_file_sent_as_the_body_is_the_job_a_form_makes(cluster: V1Cluster,
                                                         pg_url: str) -> None:
    # Given a file of 3,000 lines (several of the reader's chunks), one of them refused
    lines: list[dict | str] = [chat_line(f"b{i}", f"prompt {i} " + "word " * 60)
                               for i in range(3000)]
    lines[1234] = "{not json"
    data = jsonl(lines)
    # When it is sent as a form and as the body, with the same options
    form = httpx.post(f"{cluster.api_url}/jobs", files={"file": ("in.jsonl", data)},
                      data={"queue": "bulk", "metadata": '{"run": "7"}'},
                      headers=cluster.headers("team-a"), timeout=60)
    body = post_body(cluster, data, queue="bulk", metadata='{"run": "7"}',
                     filename="in.jsonl")
    # Then both make the same job: counts, options, and every line stored alike
    assert (form.status_code, body.status_code) == (201, 201), body.text
    a, b = form.json(), body.json()
    assert a["request_counts"] == b["request_counts"] == {
        **a["request_counts"], "total": 3000, "failed": 1}
    assert (b["queue"], b["metadata"]) == ("bulk", {"run": "7"})
    assert stored(pg_url, a["id"]) == stored(pg_url, b["id"])
    assert len(stored(pg_url, b["id"])) == 3000


def test_a_duplicate_custom_id_in_the_body_names_both_lines(cluster: V1Cluster) -> None:
    data = jsonl([chat_line(f"d{i}") for i in range(2000)] + [chat_line("d3")])
    refused = post_body(cluster, data)
    assert refused.status_code == 400
    assert refused.json()["error"]["message"].startswith(
        "duplicate custom_id 'd3' on lines 4 and 2001")


def test_a_refusal_is_a_clear_400(cluster: V1Cluster) -> None:
    over = post_body(cluster, jsonl([chat_line(f"o{i}") for i in range(5001)]))
    assert over.status_code == 400
    assert "more than 5000 requests (QUOTAFLOW_MAX_LINES)" in over.json()["error"]["message"]
    empty = post_body(cluster, b"")
    assert empty.status_code == 400 and "empty" in empty.json()["error"]["message"]


def test_a_body_over_the_file_limit_is_a_413_and_stores_nothing(cluster: V1Cluster,
                                                                pg_url: str) -> None:
    # Given a file of 4,900 lines, over QUOTAFLOW_MAX_FILE_BYTES (4 MiB) by a little
    data = jsonl([chat_line(f"big{i}", "word " * 150) for i in range(4900)])
    assert 4 * 1024 * 1024 < len(data) < 5 * 1024 * 1024
    # Then it is refused as the form route refuses it, and no line of it is stored
    for sent in (data, iter([data[:1 << 20], data[1 << 20:]])):  # with a length, chunked
        over = post_body(cluster, sent, key="too-big")  # type: ignore[arg-type]
        assert over.status_code == 413, over.text
    with get_engine(pg_url).connect() as conn:
        assert conn.scalar(text("SELECT count(*) FROM items WHERE custom_id = 'big0'")) == 0


def test_a_body_cut_short_stores_nothing(cluster: V1Cluster, pg_url: str) -> None:
    # Given a body the client stops sending halfway, between two lines
    data = jsonl([chat_line(f"c{i}") for i in range(3000)])
    half = data[:data.index(b"\n", len(data) // 2) + 1]
    url = urlsplit(cluster.api_url)
    headers = cluster.headers("team-a") | {
        "Host": url.netloc, "Content-Type": "application/jsonl",
        "Content-Length": str(len(data)), "Idempotency-Key": "cut-short"}
    request = (b"POST /jobs/jsonl HTTP/1.1\r\n"
               + b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items()) + b"\r\n")
    with socket.create_connection((url.hostname, url.port)) as conn:
        conn.sendall(request + half)
        time.sleep(1.0)  # the API reads and stores what came
    # When it goes away, then: no job, no line of it (read to the cut, it would be one)
    time.sleep(2.0)
    with get_engine(pg_url).connect() as conn:
        assert conn.scalar(text("SELECT count(*) FROM jobs WHERE idempotency_key = "
                                "'cut-short'")) == 0
        assert conn.scalar(text("SELECT count(*) FROM items WHERE custom_id = 'c0' AND "
                                "job_id NOT IN (SELECT id FROM jobs)")) == 0
    # And the same key then makes the whole job
    whole = post_body(cluster, data, key="cut-short")
    assert whole.status_code == 201 and whole.json()["request_counts"]["total"] == 3000

"""Ingest through the real API process and CLI: idempotency keys on POST /jobs and
/v1/batches, the CLI's retry of an upload the API is slow to answer, the line limits of
the two routes, and refusals that are clear 400s leaving nothing behind."""

import subprocess
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from quotaflow.db import get_engine
from quotaflow.tenants.quotas import tenant_lock_key
from tests.harness.factories import HOSTILE_LINES, chat_line, jsonl, write_jsonl
from tests.harness.openai_cluster import V1Cluster, start_cluster
from tests.harness.procs import quotaflow

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def cluster(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[V1Cluster]:
    # No workers: the jobs only need to be made. Small line limits, so that they are
    # tested without giant files: /jobs takes 40 lines, /v1/batches 20 (OpenAI: 50,000).
    yield from start_cluster(pg_url, tmp_path_factory.mktemp("ingest"),
                             tenants=("team-a", "team-b"), workers=0,
                             QUOTAFLOW_MAX_LINES="40", QUOTAFLOW_MAX_BATCH_LINES="20")


def jobs_with_key(pg_url: str, key: str) -> list[tuple[str, str]]:
    with get_engine(pg_url).connect() as conn:
        return [tuple(row) for row in conn.execute(
            text("SELECT tenant, id FROM jobs WHERE idempotency_key = :key"), {"key": key})]


def post_job(cluster: V1Cluster, tenant: str, data: bytes,
             key: str | None = None) -> httpx.Response:
    return httpx.post(f"{cluster.api_url}/jobs", files={"file": ("in.jsonl", data)},
                      headers=cluster.headers(tenant) | ({"Idempotency-Key": key} if key else {}),
                      timeout=60)


def test_jobs_takes_more_lines_than_v1_batches(cluster: V1Cluster, pg_url: str) -> None:
    data = jsonl([chat_line(f"m{i}") for i in range(30)])
    made = post_job(cluster, "team-a", data)
    assert made.status_code == 201 and made.json()["request_counts"]["total"] == 30
    client = openai.OpenAI(base_url=cluster.base_url, api_key=cluster.keys["team-a"],
                           max_retries=0)
    uploaded = client.files.create(file=("thirty.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT,
                                  completion_window="24h")
    assert batch.status == "failed"
    assert "more than 20 requests (QUOTAFLOW_MAX_BATCH_LINES)" in batch.errors.data[0].message
    # and over /jobs' own limit: a 400 that says so, and no job
    with get_engine(pg_url).connect() as conn:
        before = conn.scalar(text("SELECT count(*) FROM jobs"))
    refused = post_job(cluster, "team-a", jsonl([chat_line(f"n{i}") for i in range(41)]))
    assert refused.status_code == 400
    assert "more than 40 requests (QUOTAFLOW_MAX_LINES)" in refused.json()["error"]["message"]
    with get_engine(pg_url).connect() as conn:
        assert conn.scalar(text("SELECT count(*) FROM jobs")) == before


def test_a_bad_file_is_a_400_naming_its_lines(cluster: V1Cluster) -> None:
    data = jsonl([chat_line("d1"), "{oops", chat_line("d2"), chat_line("d1")])
    refused = post_job(cluster, "team-a", data)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["message"].startswith("duplicate custom_id 'd1' on lines 1 and 4")
    assert error["data"] == [{"line": 4, "message": "duplicate custom_id 'd1'"}]


def test_hostile_lines_are_line_errors_on_both_routes(cluster: V1Cluster) -> None:
    # Given a file from Excel (a byte-order mark) with every hostile line between good ones
    lines: list[dict | str] = [chat_line("h-0")]
    for n, (line, _, _) in enumerate(HOSTILE_LINES.values(), start=1):
        lines += [line, chat_line(f"h-{n}")]
    data = b"\xef\xbb\xbf" + jsonl(lines)
    good, bad = len(HOSTILE_LINES) + 1, len(HOSTILE_LINES)
    # When it is sent to POST /jobs: a job of its good lines, first one included
    made = post_job(cluster, "team-a", data)
    assert made.status_code == 201, made.text
    counts = made.json()["request_counts"]
    assert (counts["total"], counts["failed"], counts["pending"]) == (good + bad, bad, good)
    errors = httpx.get(f"{cluster.api_url}/jobs/{made.json()['id']}/errors",
                       headers=cluster.headers("team-a")).text.splitlines()
    reasons = [HOSTILE_LINES[name][1] for name in HOSTILE_LINES]
    assert all(reason in error for reason, error in zip(reasons, errors, strict=True))
    # And as an OpenAI batch: running, each hostile line in errors.data with its line
    client = openai.OpenAI(base_url=cluster.base_url, api_key=cluster.keys["team-a"],
                           max_retries=0)
    uploaded = client.files.create(file=("excel.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT,
                                  completion_window="24h")
    assert batch.status == "in_progress" and batch.request_counts.total == good + bad
    assert [(e.line, reason in e.message) for e, reason in zip(batch.errors.data, reasons,
                                                                strict=True)] == [
        (2 * n, True) for n in range(1, bad + 1)]


def test_the_same_key_gives_the_same_job(cluster: V1Cluster, pg_url: str) -> None:
    data = jsonl([chat_line("i1"), chat_line("i2")])
    first = post_job(cluster, "team-a", data, key="order-42")
    again = post_job(cluster, "team-a", data, key="order-42")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    other = post_job(cluster, "team-b", data, key="order-42")  # a key is per tenant
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]
    assert sorted(jobs_with_key(pg_url, "order-42")) == sorted(
        [("team-a", first.json()["id"]), ("team-b", other.json()["id"])])
    # The OpenAI-compatible route honours the key too
    client = openai.OpenAI(base_url=cluster.base_url, api_key=cluster.keys["team-a"],
                           max_retries=0)
    uploaded = client.files.create(file=("k.jsonl", data), purpose="batch")
    made = [client.batches.create(input_file_id=uploaded.id, endpoint=CHAT,
                                  completion_window="24h",
                                  extra_headers={"Idempotency-Key": "batch-7"})
            for _ in range(2)]
    assert made[0].id == made[1].id and made[0].status == "in_progress"
    assert len(jobs_with_key(pg_url, "batch-7")) == 1


def test_the_cli_retries_a_slow_upload_with_the_same_key(cluster: V1Cluster,
                                                         pg_url: str) -> None:
    # Given the API stuck before it can commit the job (the test holds the tenant's lock,
    # which a tenant with a token limit takes as its job is made)
    path = write_jsonl(cluster.workdir / "cli-retry.jsonl",
                       [chat_line(f"s{i}") for i in range(25)])
    dsn = make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)
    lock = psycopg.connect(dsn, autocommit=True)
    lock.execute("INSERT INTO tenants (name, max_enqueued_tokens, weight, created_at) "
                 "VALUES ('team-a', 1000000000, 1, now()) ON CONFLICT (name) "
                 "DO UPDATE SET max_enqueued_tokens = EXCLUDED.max_enqueued_tokens")
    lock.execute("SELECT pg_advisory_lock(%s)", (tenant_lock_key("team-a"),))
    env = {**cluster.env, "QUOTAFLOW_API_KEY": cluster.keys["team-a"]}
    cli = subprocess.Popen(quotaflow("submit", str(path), "--timeout", "1"), env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    notes: list[str] = []
    busy = threading.Event()

    def read_notes() -> None:
        assert cli.stderr is not None
        for line in cli.stderr:
            notes.append(line)
            if "busy" in line:
                busy.set()

    reader = threading.Thread(target=read_notes, daemon=True)
    reader.start()
    try:
        # When its answer does not come within the CLI's timeout
        assert busy.wait(60), "".join(notes)
    finally:
        lock.execute("SELECT pg_advisory_unlock(%s)", (tenant_lock_key("team-a"),))
        lock.execute("UPDATE tenants SET max_enqueued_tokens = NULL WHERE name = 'team-a'")
        lock.close()
    stdout, _ = cli.communicate(timeout=60)
    reader.join(10)
    # Then the CLI said the API was busy (not unreachable), sent the file again with the
    # same key, and printed the one job the API made
    assert cli.returncode == 0, "".join(notes)
    assert "the quotaflow API is busy" in notes[0] and "same Idempotency-Key" in notes[0]
    assert not any("cannot reach" in note for note in notes)
    with get_engine(pg_url).connect() as conn:
        made = conn.execute(text("SELECT id, idempotency_key FROM jobs WHERE tenant = 'team-a' "
                                 "AND input_filename = 'cli-retry.jsonl'")).all()
    assert len(made) == 1 and made[0][1].startswith("qf-submit-")
    assert stdout.strip() == made[0][0]


def test_an_api_that_is_not_there_is_reported_at_once(cluster: V1Cluster) -> None:
    # A port where nothing listens is unreachable; that stays the message for it
    env = {**cluster.env, "QUOTAFLOW_API_URL": "http://127.0.0.1:9", "QUOTAFLOW_API_KEY": "x"}
    path = write_jsonl(cluster.workdir / "one.jsonl", [chat_line("u1")])
    started = time.monotonic()
    result = subprocess.run(quotaflow("submit", str(path)), env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 4 and "cannot reach the quotaflow API" in result.stderr
    assert "note:" not in result.stderr  # not retried: nothing can have been made
    assert time.monotonic() - started < 30


def waiting_lines(pg_url: str, job_id: str) -> int:
    with get_engine(pg_url).connect() as conn:
        return conn.execute(text("SELECT count(*) FROM items WHERE job_id = :job "
                                 "AND status = 'waiting'"), {"job": job_id}).scalar_one()


def test_a_job_asks_its_own_way_of_sharing_identical_lines(cluster: V1Cluster,
                                                           pg_url: str) -> None:
    # Four identical sampling lines: sent each by default, shared when the job asks
    data = jsonl([chat_line(f"d{i}", "the same", temperature=1) for i in range(4)])
    for form, waiting in (({}, 0), ({"dedup": "true"}, 3), ({"dedup": "false"}, 0)):
        made = httpx.post(f"{cluster.api_url}/jobs", files={"file": ("in.jsonl", data)},
                          data=form, headers=cluster.headers("team-a"), timeout=60)
        assert made.status_code == 201, made.text
        assert waiting_lines(pg_url, made.json()["id"]) == waiting
    # and through /v1/batches, as metadata (OpenAI's request has no field for it)
    client = openai.OpenAI(base_url=cluster.base_url, api_key=cluster.keys["team-a"],
                           max_retries=0)
    uploaded = client.files.create(file=("same.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=CHAT,
                                  completion_window="24h", metadata={"quotaflow_dedup": "true"})
    assert waiting_lines(pg_url, batch.id) == 3
    with pytest.raises(openai.BadRequestError, match="quotaflow_dedup"):
        client.batches.create(input_file_id=uploaded.id, endpoint=CHAT,
                              completion_window="24h", metadata={"quotaflow_dedup": "yes"})

"""Ingest (quotaflow/ingest/pipeline.py) in process, on the real PostgreSQL: a refused file leaves
nothing, whatever refused it and however late; identical requests and idempotency keys;
batch messages written without send_task. (SQLite and the line reader:
tests/unit/ingest/test_ingest.py.)"""

import base64
import io
import json
import threading
import time

import pytest
import redis
from sqlalchemy import select, text

from quotaflow.dispatch.queues import BatchRef, CollectingDispatcher
from quotaflow.errors import EnqueuedTokenLimit, InputFileError
from quotaflow.ingest import linescan
from quotaflow.ingest import pipeline as ingest
from quotaflow.models import Item, Result
from quotaflow.tenants import quotas
from tests.harness.factories import HOSTILE_LINES, chat_line, jsonl
from tests.unit.ingest.test_ingest import big_file, make, row_counts
from workers.dispatch import CeleryDispatcher


def test_a_duplicate_custom_id_on_the_last_line_leaves_nothing(pg_sessions, settings) -> None:
    # Given 20,000 lines (some invalid) whose very last line repeats the first's custom_id
    lines = [*big_file(20_000, invalid_every=97), chat_line("r1", "another question")]
    # When it is ingested, it is refused naming both lines, after everything was sent
    with pytest.raises(InputFileError, match="duplicate custom_id 'r1' on lines 1 and 20001"):
        make(pg_sessions, settings, jsonl(lines))
    # And no job, item or result of it is left
    assert row_counts(pg_sessions) == (0, 0, 0)


def test_a_duplicate_within_a_file_is_found_without_a_rewindable_stream(pg_sessions,
                                                                         settings) -> None:
    class OneWay(io.RawIOBase):
        def __init__(self, data: bytes) -> None:
            self._data = io.BytesIO(data)

        def readable(self) -> bool:
            return True

        def readinto(self, buffer) -> int:
            return self._data.readinto(buffer)

    stream = io.BufferedReader(OneWay(jsonl([chat_line("a"), chat_line("b"), chat_line("a")])))
    with pytest.raises(InputFileError, match="duplicate custom_id 'a'; each custom_id"):
        ingest.create_job(pg_sessions, stream, settings=settings,
                          deployments=settings.load_deployments(),
                          dispatcher=CollectingDispatcher(), spec=ingest.JobSpec(queue="bulk"))
    assert row_counts(pg_sessions) == (0, 0, 0)


def test_a_file_over_max_lines_or_over_the_quota_leaves_nothing(pg_sessions, settings) -> None:
    settings.max_lines = 100
    with pytest.raises(InputFileError, match=r"more than 100 requests \(QUOTAFLOW_MAX_LINES\)"):
        make(pg_sessions, settings, jsonl(big_file(150, invalid_every=7)))
    with pytest.raises(InputFileError, match=r"more than 20 .*QUOTAFLOW_MAX_BATCH_LINES"):
        make(pg_sessions, settings, jsonl(big_file(30)), max_lines=20,
             endpoint="/v1/chat/completions")
    settings.max_enqueued_tokens = 500  # 10 tokens a line: refused at the 51st, mid-file
    with pytest.raises(EnqueuedTokenLimit, match="this batch has at least 510 prompt tokens"):
        make(pg_sessions, settings, jsonl([chat_line(f"t{i}", f"{i:04d}" + "x" * 36)
                                           for i in range(100)]))
    assert row_counts(pg_sessions) == (0, 0, 0)
    # and a file within every limit is taken, counting its tokens once
    job = make(pg_sessions, settings, jsonl(big_file(90, invalid_every=10))).job
    assert job.total == 90 and 0 < job.enqueued_tokens <= 500
    assert row_counts(pg_sessions) == (1, 90, 9)


def test_identical_requests_wait_on_the_first_even_past_the_suspect_list(
        pg_sessions, settings, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given more repeated bodies than the in-memory suspect list holds
    monkeypatch.setattr(linescan, "MAX_SUSPECTS", 3)
    settings.batch_size = 4
    prompts = ["a", "b", "c", "d", "e", "a", "b", "c", "d", "e", "f", "a"]
    dispatcher = CollectingDispatcher()
    job = ingest.create_job(pg_sessions, io.BytesIO(jsonl(
        [chat_line(f"x{i}", p, temperature=0) for i, p in enumerate(prompts, 1)])),
        settings=settings,
        deployments=settings.load_deployments(), dispatcher=dispatcher,
        spec=ingest.JobSpec(queue="bulk")).job
    with pg_sessions() as session:
        rows = session.execute(select(Item.line_no, Item.status, Item.duplicate_of)
                               .where(Item.job_id == job.id).order_by(Item.line_no)).all()
    # Then each copy waits on the first line with its body, and only originals are sent
    assert [(line, status, dup) for line, status, dup in rows if dup] == [
        (6, "waiting", 1), (7, "waiting", 2), (8, "waiting", 3), (9, "waiting", 4),
        (10, "waiting", 5), (12, "waiting", 1)]
    assert [(b.first_line, b.last_line) for b in dispatcher.batches] == [(1, 4), (5, 11)]


def test_the_same_idempotency_key_while_the_first_is_still_ingesting(pg_sessions,
                                                                     settings) -> None:
    # Given the tenant's lock held (a tenant with a token limit takes it as its job is
    # made), so the first request stops just before its commit
    settings.max_enqueued_tokens = 10**12
    made: list[ingest.Created] = []
    data = jsonl(big_file(50))
    with pg_sessions.begin() as holder:
        quotas.lock_tenant(holder, "acme")
        threads = [threading.Thread(target=lambda: made.append(
            make(pg_sessions, settings, data, tenant="acme", idempotency_key="k-1")))
            for _ in range(2)]
        for thread in threads:
            thread.start()
            time.sleep(0.5)  # the second finds the first's uncommitted row and waits
        assert made == []
    for thread in threads:
        thread.join(30)
    # Then one job was made, and the other request got it back
    assert sorted(m.replayed for m in made) == [False, True]
    assert made[0].job.id == made[1].job.id
    assert row_counts(pg_sessions) == (1, 50, 0)
    # And a later request with that key gets it too, while another tenant's key is its own
    again = make(pg_sessions, settings, data, tenant="acme", idempotency_key="k-1")
    assert again.replayed and again.job.id == made[0].job.id
    other = make(pg_sessions, settings, data, tenant="globex", idempotency_key="k-1")
    assert not other.replayed and other.job.id != made[0].job.id


def test_numbers_keep_their_value(pg_sessions, settings) -> None:
    line = chat_line("n", "numbers")
    line["body"]["seed"] = 123456789012345678901234567890
    line["body"]["temperature"] = 0.00001
    job = make(pg_sessions, settings, jsonl([line])).job
    with pg_sessions() as session:
        body = session.scalar(select(Item.body).where(Item.job_id == job.id))
        stored = session.scalar(text("SELECT body::json->>'seed' FROM items WHERE job_id = :j"),
                                {"j": job.id})
    assert body["seed"] == 123456789012345678901234567890 and stored == str(body["seed"])
    assert body["temperature"] == 0.00001
    assert json.loads(json.dumps(body)) == line["body"]


def test_a_body_is_stored_as_the_text_ingest_made_and_read_back_as_an_object(
        pg_sessions, settings) -> None:
    # Given a line whose body's keys are out of order and spaced
    raw = (b'{"custom_id": "t", "method": "POST", "url": "/v1/chat/completions", "body": '
           b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], '
           b'"max_tokens": 5}}\n')
    job = make(pg_sessions, settings, raw).job
    with pg_sessions() as session:
        kind = session.scalar(text("SELECT data_type FROM information_schema.columns "
                                   "WHERE table_name = 'items' AND column_name = 'body'"))
        stored = session.scalar(text("SELECT body FROM items WHERE job_id = :j"), {"j": job.id})
        body = session.scalar(select(Item.body).where(Item.job_id == job.id))
    # Then the column is text (the server checks no JSON on the COPY, migration 0020),
    # holding ingest's compact sorted text, and the model's type gives the object back
    assert kind == "text"
    assert stored == ('{"max_tokens":5,"messages":[{"content":"hi","role":"user"}],'
                      '"model":"gpt-4o-mini"}')
    assert body == {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 5}


def test_custom_ids_and_bodies_are_stored_exactly_as_written(pg_sessions, settings) -> None:
    # Given ids and text that COPY's text format would have to escape, and multi-byte
    # characters whose bytes outnumber their characters (the binary rows give lengths)
    ids = ["tab\there", "new\nline\r", "back\\slash\\N", "é ünïcødé 🚀", "x" * 512]
    lines: list[dict | str] = []
    for custom_id in ids:
        line = chat_line(custom_id, "a \\ backslash, a \t tab, a \n newline, \u00e9 and 🚀")
        lines.append(line)
    lines.append({"custom_id": "refused 🚀\t", "method": "GET"})
    made = make(pg_sessions, settings, jsonl(lines))
    # Then every one is stored as it came, the refused line's id too
    with pg_sessions() as session:
        rows = session.execute(select(Item.line_no, Item.custom_id, Item.body, Item.status)
                               .where(Item.job_id == made.job.id)
                               .order_by(Item.line_no)).all()
    assert [(row.line_no, row.custom_id) for row in rows] == [
        *enumerate(ids, start=1), (len(ids) + 1, "refused 🚀\t")]
    assert [row.body for row in rows[:-1]] == [line["body"] for line in lines[:-1]]
    assert (rows[-1].body, rows[-1].status) == (None, "failed")


def test_hostile_lines_are_each_their_own_error(pg_sessions, settings) -> None:
    # Given a file starting with a byte-order mark, each hostile line between good ones
    lines: list[dict | str] = [chat_line("good-0")]
    for n, (line, _, _) in enumerate(HOSTILE_LINES.values(), start=1):
        lines += [line, chat_line(f"good-{n}")]
    made = make(pg_sessions, settings, b"\xef\xbb\xbf" + jsonl(lines))
    # Then the job runs its good lines, the first one included
    assert made.counts == {"pending": len(HOSTILE_LINES) + 1, "failed": len(HOSTILE_LINES)}
    with pg_sessions() as session:
        items = dict(session.execute(select(Item.line_no, Item.custom_id)
                                     .where(Item.job_id == made.job.id)).all())
        errors = dict(session.execute(select(Result.line_no, Result.error)
                                      .where(Result.job_id == made.job.id)).all())
        stored_ids = session.scalars(select(Result.custom_id)
                                     .where(Result.job_id == made.job.id)).all()
    assert items[1] == "good-0"
    # And each hostile line is a failed item with its reason, without its custom_id
    for n, (name, (_, reason, custom_id)) in enumerate(HOSTILE_LINES.items(), start=1):
        line_no = 2 * n
        assert reason in errors[line_no]["message"], name
        assert items[line_no] == custom_id and items[line_no + 1] == f"good-{n}"
    assert set(stored_ids) == {None}


def test_pipelined_batch_messages_are_what_send_task_writes(redis_url: str) -> None:
    # The first message goes through Celery's send_task, the rest through the pipeline
    CeleryDispatcher(redis_url).dispatch("bulk", [BatchRef("batch_q", 1, 25),
                                                  BatchRef("batch_q", 26, 50)])
    client = redis.Redis.from_url(redis_url)
    sent, pushed = (json.loads(client.lindex("bulk", index)) for index in (-1, -2))
    per_message = {"id", "root_id", "argsrepr", "correlation_id", "delivery_tag"}

    def fixed(message: dict) -> dict:
        return {**{k: v for k, v in message.items() if k not in ("body", "headers",
                                                                 "properties")},
                **{k: v for k, v in message["headers"].items() if k not in per_message},
                **{k: v for k, v in message["properties"].items() if k not in per_message}}

    assert fixed(pushed) == fixed(sent)
    assert list(pushed["headers"]) == list(sent["headers"])
    assert pushed["headers"]["root_id"] == pushed["headers"]["id"] != sent["headers"]["id"]
    assert pushed["properties"]["correlation_id"] == pushed["headers"]["id"]
    bodies = [json.loads(base64.b64decode(m["body"])) for m in (sent, pushed)]
    assert [b[0] for b in bodies] == [["batch_q", 1, 25], ["batch_q", 26, 50]]
    assert bodies[0][1:] == bodies[1][1:]
    client.close()

"""An answer PostgreSQL cannot store as sent (a NUL character) is stored with the
character replaced, and the rest of its chunk with it, instead of failing them all."""

import io
import json
from datetime import timedelta

from sqlalchemy import select, text

from quotaflow.dispatch.queues import BatchRef
from quotaflow.ingest import pipeline
from quotaflow.models import Result
from quotaflow.providers.base import ProviderResponse
from quotaflow.results import leases, output
from tests.harness.factories import chat_line, jsonl


def test_a_nul_in_an_answer_does_not_fail_its_chunk(pg_sessions, settings) -> None:
    class Collect:
        def dispatch(self, queue: str, refs: list) -> None:
            pass

    job = pipeline.create_job_in_process(
        pg_sessions, io.BytesIO(jsonl([chat_line("a"), chat_line("b")])), settings=settings,
        deployments=settings.load_deployments(), dispatcher=Collect(), queue="realtime")
    first, second = leases.claim(pg_sessions, BatchRef(job.id, 1, 2), "w",
                                 timedelta(seconds=30))
    odd = rb'{"choices":[{"message":{"content":"a\u0000b \\u0000 stays"}}]}'
    plain = rb'{"choices":[{"message":{"content":"fine"}}]}'
    answers = [(first, ProviderResponse(200, {}, None, 1, 1, raw=odd)),
               (second, ProviderResponse(200, {}, None, 1, 1, raw=plain))]
    assert leases.store_many(pg_sessions, job.id, answers) == (2, 0)
    with pg_sessions() as session:
        lines = [json.loads(line) for line in output.iter_output(session, job.id, errors=False)]
    content = lines[0]["response"]["body"]["choices"][0]["message"]["content"]
    assert content == "a\ufffdb \\u0000 stays"
    assert lines[1]["response"]["body"]["choices"][0]["message"]["content"] == "fine"


def test_an_answer_is_stored_as_text_as_it_came_and_read_back_as_an_object(
        pg_sessions, settings) -> None:
    # Given an answer spaced and ordered as its provider wrote it
    job = pipeline.create_job_in_process(
        pg_sessions, io.BytesIO(jsonl([chat_line("a")])), settings=settings,
        deployments=settings.load_deployments(), dispatcher=_Ignore(), queue="realtime")
    [item] = leases.claim(pg_sessions, BatchRef(job.id, 1, 1), "w", timedelta(seconds=30))
    raw = b'{"z": 1,  "choices": [{"message": {"content": "hi"}}], "big": 123456789012345678901234}'
    assert leases.store_many(pg_sessions, job.id,
                             [(item, ProviderResponse(200, {}, None, 1, 1, raw=raw))]) == (1, 0)
    # When it is read back, as the column holds it and through the model
    with pg_sessions() as session:
        kind = session.scalar(text("SELECT data_type FROM information_schema.columns "
                                   "WHERE table_name = 'results' AND column_name = 'response'"))
        stored = session.scalar(text("SELECT response FROM results WHERE job_id = :j"),
                                {"j": job.id})
        answer = session.scalar(select(Result.response).where(Result.job_id == job.id))
    # Then the column is text (the server parses no answer, migration 0021) holding the
    # provider's bytes, and the model's type gives the object back, its numbers exact
    assert kind == "text"
    assert stored == raw.decode()
    assert answer == {"z": 1, "choices": [{"message": {"content": "hi"}}],
                      "big": 123456789012345678901234}


class _Ignore:
    def dispatch(self, queue: str, refs: list) -> None:
        pass

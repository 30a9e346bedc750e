"""Downloads written by PostgreSQL (output_pieces) are byte for byte the lines Python
writes (output.iter_output), whatever the strings hold, in input order, across pieces."""

import io
import json
from datetime import timedelta

import pytest

from quotaflow.dispatch.queues import BatchRef
from quotaflow.ingest import pipeline
from quotaflow.providers.base import ProviderResponse
from quotaflow.providers.outcomes import Failure, FailureCode, Shared
from quotaflow.results import leases, output, output_pieces
from quotaflow.store import postgres
from tests.harness.factories import chat_line, jsonl

ODD = ['plain', 'quo"te \\ back', 'tab\tnew\nline\r\x01\x1f', 'ünï ☃ 𝄞', '</script>/',
       'e\u2028f']


class _Collect:
    def dispatch(self, queue: str, refs: list) -> None:
        pass


@pytest.mark.parametrize("piece_lines", [2, 1000])
def test_sql_lines_equal_python_lines(pg_sessions, settings, monkeypatch,
                                      piece_lines: int) -> None:
    monkeypatch.setattr(postgres, "PIECE_LINES", piece_lines)
    lines = [chat_line(f"id-{n}-{text}", prompt=f"p{n}") for n, text in enumerate(ODD * 2)]
    job = pipeline.create_job_in_process(
        pg_sessions, io.BytesIO(jsonl(lines)), settings=settings,
        deployments=settings.load_deployments(), dispatcher=_Collect(), queue="realtime")
    claimed = leases.claim(pg_sessions, BatchRef(job.id, 1, len(lines)), "w",
                           timedelta(seconds=30))
    outcomes = []
    for n, item in enumerate(claimed):
        text = ODD[n % len(ODD)]
        content = json.dumps(text)
        raw = f'{{"id":"c{n}","choices":[{{"message":{{"content":{content}}}}}],"n":1e400}}'
        raw = raw.encode()
        if n % 5 == 3:
            outcome = Failure(FailureCode.PROVIDER_ERROR, f"bad {text}", 400, {"e": text}, 1)
        elif n % 5 == 4:
            outcome = Shared(200, {"shared": text}, {"id": "r", "custom_id": text,
                                                     "batch_id": job.id})
        else:
            outcome = ProviderResponse(200, {}, f"prov-{text}" if n % 2 else None, 1, 1,
                                       raw=raw)
        outcomes.append((item, outcome))
    leases.store_many(pg_sessions, job.id, outcomes)
    with pg_sessions() as session:
        for errors in (False, True):
            python = "".join(output.iter_output(session, job.id, errors=errors)).encode()
            sql = b"".join(output_pieces.output_pieces(session, job.id, errors=errors))
            assert sql == python
    assert python.count(b"\n") > 0 and sql.count(b"\n") > 0


def test_the_sql_path_is_the_one_taken(pg_sessions, settings, monkeypatch) -> None:
    """A guard on the test above: it compares two renderings, not one with itself."""
    job = pipeline.create_job_in_process(
        pg_sessions, io.BytesIO(jsonl([chat_line("x")])), settings=settings,
        deployments=settings.load_deployments(), dispatcher=_Collect(), queue="realtime")
    (item,) = leases.claim(pg_sessions, BatchRef(job.id, 1, 1), "w", timedelta(seconds=30))
    leases.store_many(pg_sessions, job.id, [(item, ProviderResponse(200, {}, None, 1, 1,
                                                                    raw=b'{"a":1}'))])
    monkeypatch.setattr(output_pieces, "iter_output", None)
    with pg_sessions() as session:
        assert b"".join(output_pieces.output_pieces(session, job.id, errors=False)).count(
            b"\n") == 1


def test_answers_keep_their_text_and_a_pretty_printed_one_stays_one_line(
        pg_sessions, settings) -> None:
    # Given two answers: one compact in the provider's own key order, one pretty-printed
    # (as OpenAI's API sends its bodies), with a long number jsonb would have rewritten
    job = pipeline.create_job_in_process(
        pg_sessions, io.BytesIO(jsonl([chat_line("compact"), chat_line("pretty")])),
        settings=settings, deployments=settings.load_deployments(), dispatcher=_Collect(),
        queue="realtime")
    compact = b'{"object":"chat.completion","id":"c1","created":12345678901234567890123}'
    body = {"object": "chat.completion", "id": "c2", "choices": [{"index": 0}]}
    pretty = json.dumps(body, indent=2).encode() + b"\n"
    items = leases.claim(pg_sessions, BatchRef(job.id, 1, 2), "w", timedelta(seconds=30))
    leases.store_many(pg_sessions, job.id, [
        (items[0], ProviderResponse(200, {}, None, 1, 1, raw=compact)),
        (items[1], ProviderResponse(200, body, None, 1, 1, raw=pretty))])
    # When the job's output is downloaded, both ways
    with pg_sessions() as session:
        sql = b"".join(output_pieces.output_pieces(session, job.id, errors=False))
        python = "".join(output.iter_output(session, job.id, errors=False)).encode()
    # Then it is two lines, the first answer's text as the provider wrote it (its key
    # order, its number's digits), the second the same object
    assert sql == python and sql.count(b"\n") == 2
    first, second = sql.splitlines()
    assert b'"body":' + compact + b"}" in first
    assert json.loads(second)["response"]["body"] == body

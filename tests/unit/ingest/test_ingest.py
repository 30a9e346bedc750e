"""Ingest (quotaflow/ingest/pipeline.py) with no server: the line reader's edges, the filter that
flags repeated bodies, and on SQLite a refused file leaving nothing. The same on the real
PostgreSQL, with identical requests, idempotency keys and batch messages, is
tests/cluster/test_ingest.py (which makes its jobs with `make` here)."""

import io
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from quotaflow.config import Settings
from quotaflow.db import session_factory, upgrade
from quotaflow.dispatch.queues import CollectingDispatcher
from quotaflow.errors import InputFileError
from quotaflow.ingest import dedup, formats, jsonlines
from quotaflow.ingest import pipeline as ingest
from quotaflow.models import Item, Job, Result
from tests.harness.factories import chat_line, jsonl


def make(sessions: sessionmaker[Session], settings: Settings, data: bytes,
         **spec: object) -> ingest.Created:
    return ingest.create_job(sessions, io.BytesIO(data), settings=settings,
                             deployments=settings.load_deployments(),
                             dispatcher=CollectingDispatcher(),
                             spec=ingest.JobSpec(**{"queue": "bulk", **spec}))


def row_counts(sessions: sessionmaker[Session]) -> tuple[int, ...]:
    with sessions() as session:
        return tuple(session.scalar(select(func.count()).select_from(model))
                     for model in (Job, Item, Result))


def big_file(count: int, invalid_every: int = 0) -> list[dict | str]:
    """Distinct requests, with an invalid line every so often (they write result rows)."""
    return [("{not json" if invalid_every and i % invalid_every == 0 else
             chat_line(f"r{i}", f"question {i}")) for i in range(1, count + 1)]


def test_the_seen_filter_never_misses_a_repeat() -> None:
    seen = dedup.SeenFilter(1000)
    digests = [formats.body_digest("/v1/embeddings", str(i).encode()) for i in range(1000)]
    assert sum(seen.add(d) for d in digests) <= 5  # a new body is rarely flagged
    assert all(seen.add(d) for d in digests)  # a repeated one always is


def test_sqlite_ingest_names_a_duplicate_and_leaves_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'embedded.db'}"
    upgrade(url)
    sessions = session_factory(url)
    settings = Settings(database_url=url, _env_file=None)
    lines = [*big_file(2500, invalid_every=50), chat_line("r1201", "again")]
    with pytest.raises(InputFileError, match="duplicate custom_id 'r1201' on lines 1201 and 2501"):
        make(sessions, settings, jsonl(lines))
    assert row_counts(sessions) == (0, 0, 0)
    # the same file without the duplicate: every line, the invalid ones with their error rows
    job = make(sessions, settings, jsonl([*lines[:-1], chat_line("last", "question 7")]),
               dedup=True).job
    assert row_counts(sessions) == (1, 2501, 50)
    with sessions() as session:
        assert session.execute(select(Item.status, Item.duplicate_of)
                               .where(Item.job_id == job.id, Item.line_no == 2501)
                               ).one() == ("waiting", 7)
        error = session.scalar(select(Result.error).where(Result.line_no == 50))
    assert error["line"] == 50 and "not valid JSON" in error["message"]


@pytest.mark.parametrize("block", [1, 3, 7, 64])
def test_lines_come_out_whole_whatever_the_read_size(block: int,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonlines, "_BLOCK", block)
    data = b'{"a":1}\r\n\n  \n' + b"x" * 40 + b"\n" + b'{"b":2}\n' + b"y" * 12 + b"\n" + b"tail"
    got = list(jsonlines.read_lines(io.BytesIO(data), 12))
    assert got == [(1, b'{"a":1}\r'), (2, b""), (3, b"  "), (4, None), (5, b'{"b":2}'),
                   (6, b"y" * 12), (7, b"tail")]
    assert list(jsonlines.read_lines(io.BytesIO(b"z" * 30), 12)) == [(1, None)]
    with pytest.raises(InputFileError, match="larger than the limit of 20 bytes"):
        list(jsonlines.read_lines(io.BytesIO(data), 12, max_file_bytes=20))


class _Rows:
    """What LineScan hands its writer: each pending line's body, each refused line's error."""

    def __init__(self) -> None:
        self.pending: dict[int, bytes] = {}
        self.refused: dict[int, str] = {}

    def pending_row(self, line_no: int, custom_id: str, body: bytes, *_: object) -> None:
        self.pending[line_no] = body

    def invalid(self, line_no: int, custom_id: str | None, request_id: str,
                error: bytes) -> None:
        self.refused[line_no] = error.decode()


def _scan(data: bytes) -> _Rows:
    from quotaflow.ingest.linescan import LineScan

    settings = Settings(_env_file=None)
    rows = _Rows()
    writer = type("W", (), {"pending": rows.pending_row, "invalid": rows.invalid})()
    LineScan("job", settings, settings.load_deployments(), None).run(io.BytesIO(data), writer)
    return rows


SCREENED_AWAY = {  # lines orjson takes and load_object refuses (65 levels: 2 objects, 63 arrays)
    "65 levels deep": ('{"custom_id": "deep", "method": "POST", "url": "/v1/chat/completions", '
                       '"body": {"model": "gpt-4o-mini", "messages": [{"role": "user", '
                       '"content": "x"}], "extra": ' + "[" * 63 + "]" * 63 + "}}",
                       "nested more than 64 levels deep"),
    "a NUL escape": (jsonl([chat_line("nul", "a\x00b")]).decode().strip(),
                     "NUL character"),
}


def _ending_at(offset: int) -> bytes:
    """Plain lines whose bytes end exactly at `offset` (the last one padded to fit)."""
    head = b"".join(jsonl([chat_line(f"p{i}", f"question {i}")]) for i in range(offset // 100))
    while len(head) > offset - 200:
        head = head[:head.rindex(b"\n", 0, len(head) - 1) + 1]
    base = len(jsonl([chat_line("filler", "x")])) - 1
    head += jsonl([chat_line("filler", "x" * (offset - len(head) - base))])
    assert len(head) == offset
    return head


@pytest.mark.parametrize("starts", [4096 * 3 - 1000, 4096 * 3 - 10, 4096 * 3, -2],
                         ids=["mid-block", "across blocks", "first of a block",
                              "all but its end in the block before"])
@pytest.mark.parametrize("name", [*SCREENED_AWAY, "a 25-digit seed"])
def test_a_hostile_line_among_plain_blocks_is_still_caught(
        name: str, starts: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given plain lines over many 4 KiB blocks, and one line a block's screen must not pass
    monkeypatch.setattr(jsonlines, "_BLOCK", 4096)
    if name == "a 25-digit seed":
        seeded = chat_line("seed")
        seeded["body"]["seed"] = 1234567890123456789012345
        hostile, reason = jsonl([seeded]), None
    else:
        hostile, reason = SCREENED_AWAY[name][0].encode() + b"\n", SCREENED_AWAY[name][1]
    head = _ending_at(starts if starts > 0 else 4096 * 3 - len(hostile) - starts)
    data = head + hostile + jsonl([chat_line(f"t{i}", f"question {i}") for i in range(100)])
    line_no = head.count(b"\n") + 1
    # Then it alone is refused, with its reason; a number orjson would round is kept exact
    rows = _scan(data)
    if reason is None:
        assert b"1234567890123456789012345" in rows.pending[line_no] and not rows.refused
    else:
        assert list(rows.refused) == [line_no] and reason in rows.refused[line_no]
    assert len(rows.pending) + len(rows.refused) == data.count(b"\n")

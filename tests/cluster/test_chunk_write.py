"""The chunk write on its own (the stores' store_chunk, quotaflow/store/): PostgreSQL's one
statement, on PostgreSQL, and SQLite's statements, on a SQLite file migrated to head, store
a chunk's results and close exactly the items whose rows they inserted, the same way.
A chunk stored twice (a worker retrying a write whose commit it did not see, or two
workers holding one line) stores each result once and leaves the first answer standing."""

import io
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session, sessionmaker

from quotaflow import db
from quotaflow.config import Settings
from quotaflow.ingest import pipeline
from quotaflow.models import Item, ItemStatus, Result, utcnow
from quotaflow.providers import ProviderResponse
from quotaflow.providers.outcomes import Failure, FailureCode
from quotaflow.results.rows import result_row
from quotaflow.store.interface import Store
from quotaflow.store.postgres import POSTGRES
from quotaflow.store.sqlite import SQLITE
from tests.harness.factories import chat_line, jsonl


class Keep:
    def dispatch(self, queue: str, batches: list) -> None:
        """Nothing runs: the test writes the results."""


def make_job(sessions: sessionmaker[Session], settings: Settings, lines: int) -> str:
    return pipeline.create_job_in_process(
        sessions, io.BytesIO(jsonl([chat_line(f"r{i}") for i in range(lines)])),
        settings=settings, deployments=settings.load_deployments(), dispatcher=Keep(),
        queue="bulk").id


def answer(text_: str) -> ProviderResponse:
    return ProviderResponse(200, {"choices": [{"message": {"content": text_}}]}, "req-x", 3, 2)


def statuses(sessions: sessionmaker[Session], job_id: str) -> dict[int, str]:
    with sessions() as session:
        return dict(session.execute(select(Item.line_no, Item.status)
                                    .where(Item.job_id == job_id)).all())


def stored(sessions: sessionmaker[Session], job_id: str) -> dict[int, tuple]:
    with sessions() as session:
        return {line: (code, body, error) for line, code, body, error in session.execute(
            select(Result.line_no, Result.status_code, Result.response, Result.error)
            .where(Result.job_id == job_id))}


class Place(NamedTuple):
    """A store and the database of its dialect that it writes to."""
    store: Store
    sessions: sessionmaker[Session]
    settings: Settings


@pytest.fixture(params=["postgres", "sqlite"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Place]:
    if request.param == "postgres":
        yield Place(POSTGRES, request.getfixturevalue("pg_sessions"),
                    request.getfixturevalue("settings"))
        return
    url = f"sqlite:///{tmp_path / 'chunks.db'}"
    db.upgrade(url)
    yield Place(SQLITE, db.session_factory(url), Settings(database_url=url, _env_file=None))
    db.get_engine(url).dispose()


def write(place: Place, job_id: str, rows: list[dict]) -> list[tuple]:
    with place.sessions.begin() as session:
        return place.store.store_chunk(session, job_id, rows, utcnow())


def test_a_chunk_stores_its_rows_and_closes_their_items(place: Place) -> None:
    job_id = make_job(place.sessions, place.settings, 4)
    failed = Failure(FailureCode.PROVIDER_ERROR, "upstream said no", 400, {"error": "no"}, 2)
    rows = [result_row(1, "r1", answer("one"), None), result_row(3, "r3", failed, None)]
    closed = write(place, job_id, rows)
    assert sorted(closed) == [(1, ItemStatus.SUCCEEDED), (3, ItemStatus.FAILED)]
    assert statuses(place.sessions, job_id) == {1: ItemStatus.SUCCEEDED, 2: ItemStatus.PENDING,
                                             3: ItemStatus.FAILED, 4: ItemStatus.PENDING}
    results = stored(place.sessions, job_id)
    assert set(results) == {1, 3}
    assert results[1][0] == 200 and "one" in str(results[1][1]) and results[1][2] is None
    assert results[3][2]["code"] == "provider_error" and results[3][2]["attempts"] == 2


def test_a_chunk_stored_again_changes_nothing(place: Place) -> None:
    job_id = make_job(place.sessions, place.settings, 3)
    write(place, job_id, [result_row(1, "r1", answer("first"), None)])
    # The same line answered again (another worker's call), beside a new line
    again = write(place, job_id, [result_row(1, "r1", answer("second"), None),
                                  result_row(2, "r2", answer("two"), None)])
    assert again == [(2, ItemStatus.SUCCEEDED)]  # only the row it inserted closed an item
    results = stored(place.sessions, job_id)
    assert "first" in str(results[1][1]) and "second" not in str(results[1][1])
    with place.sessions() as session:
        assert session.scalar(select(func.count()).select_from(Result)
                              .where(Result.job_id == job_id)) == 2


def test_an_item_closed_otherwise_keeps_its_status(place: Place) -> None:
    job_id = make_job(place.sessions, place.settings, 2)
    with place.sessions.begin() as session:  # cancelled while its call was in flight
        session.execute(text("UPDATE items SET status = 'cancelled' WHERE job_id = :job "
                             "AND line_no = 1"), {"job": job_id})
    closed = write(place, job_id, [result_row(1, "r1", answer("late"), None)])
    assert closed == []
    assert statuses(place.sessions, job_id)[1] == ItemStatus.CANCELLED

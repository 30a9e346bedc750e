"""What a crowd of status readers costs the API (issue 45's goals): one key lookup per
key at a time, renewed ahead of its expiry; the reads of many jobs made in one session;
and a poller's remembered read answered before FastAPI's routing, with the same bytes,
tag and 304 as the route, and only where the route would answer it so. Against a real
PostgreSQL (api/key_lookups.py, api/job_reads.py, api/status_fast_path.py)."""

import asyncio
import io
from collections.abc import Iterator

import pytest
from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

from api.job_reads import JobReads
from api.job_watch import read_job
from api.key_lookups import KeyLookups
from api.status_fast_path import StatusFastPath
from quotaflow.config import Settings
from quotaflow.db import get_engine
from quotaflow.errors import AuthenticationError, JobNotFound
from quotaflow.ingest import pipeline
from quotaflow.jobs import view as job_view
from quotaflow.models import Spend
from quotaflow.tenants.key_cache import KeyCache
from quotaflow.tenants.keys import create_key, revoke_key
from tests.harness.api_app import app_client
from tests.harness.factories import chat_line, jsonl


class Collect:
    def dispatch(self, queue: str, batches: list) -> None:
        """Nothing runs: the jobs stay as made."""


def make_job(sessions: sessionmaker[Session], settings: Settings, tenant: str) -> str:
    return pipeline.create_job_in_process(
        sessions, io.BytesIO(jsonl([chat_line(f"r{i}") for i in range(3)])),
        settings=settings, deployments=settings.load_deployments(), dispatcher=Collect(),
        queue="bulk", tenant=tenant).id


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_crowd_missing_a_key_together_makes_one_lookup(pg_sessions):
    secret = create_key(pg_sessions, "crowd").secret
    clock = Clock()
    lookups = KeyLookups(KeyCache(10.0, clock=clock))

    async def crowd() -> list:
        return await asyncio.gather(*(lookups.grant(pg_sessions, secret) for _ in range(200)))

    grants = asyncio.run(crowd())
    assert lookups.lookups == 1
    assert {grant.tenant for grant in grants} == {"crowd"}
    # Past half its time: answered from memory at once, renewed once in the background
    clock.now += 6

    async def renewing() -> tuple:
        answers = [await lookups.grant(pg_sessions, secret) for _ in range(50)]
        renewed = lookups.lookups
        await asyncio.sleep(0.5)  # the renewal's thread ends
        return answers, renewed

    answers, renewed = asyncio.run(renewing())
    assert renewed == 2 and {grant.tenant for grant in answers} == {"crowd"}
    # Past the first grant's time: the renewal's answers, with no request missing
    clock.now += 4.5
    asyncio.run(lookups.grant(pg_sessions, secret))
    assert lookups.lookups == 2


def test_a_revoked_key_still_stops_within_the_cache_time(pg_sessions):
    made = create_key(pg_sessions, "gone")
    clock = Clock()
    lookups = KeyLookups(KeyCache(10.0, clock=clock))
    asyncio.run(lookups.grant(pg_sessions, made.secret))
    revoke_key(pg_sessions, made.id)
    clock.now += 6  # renewal due: it finds the key refused and keeps nothing

    async def renew() -> None:
        await lookups.grant(pg_sessions, made.secret)
        await asyncio.sleep(0.5)

    asyncio.run(renew())
    clock.now += 5  # past the grant remembered first
    with pytest.raises(AuthenticationError):
        asyncio.run(lookups.grant(pg_sessions, made.secret))


def test_reads_of_many_jobs_share_sessions(pg_sessions, settings):
    ids = [make_job(pg_sessions, settings, "reader") for _ in range(30)]
    reads = JobReads(0.5, pg_sessions)

    async def everyone() -> list:
        return await asyncio.gather(
            *(reads.latest(("job", job_id), lambda s, j=job_id: read_job(s, j))
              for job_id in [*ids, "batch_missing"]), return_exceptions=True)

    found = asyncio.run(everyone())
    # The first read takes a session of its own; those queued meanwhile share the next
    assert reads.sessions_used <= 3, reads.sessions_used
    assert isinstance(found[-1], JobNotFound)  # one missing job fails alone
    with pg_sessions() as session:
        for job_id, seen in zip(ids, found[:-1], strict=True):
            assert seen.job == read_job(session, job_id)[1]


def test_a_round_of_reads_reads_its_jobs_ahead_in_three_statements(pg_sessions, pg_url,
                                                                   settings):
    ids = [make_job(pg_sessions, settings, "reader") for _ in range(30)]
    with pg_sessions.begin() as session:  # two of them have cost something, one unpriced
        session.add_all([Spend(job_id=ids[0], deployment="a", month="2026-12", tenant="reader",
                               cost=0.25, currency="USD"),
                         Spend(job_id=ids[0], deployment="b", month="2026-12", tenant="reader",
                               cost=None, currency=None),
                         Spend(job_id=ids[1], deployment="a", month="2026-11", tenant="reader",
                               cost=1.5, currency="USD")])
    with pg_sessions() as session:
        plain = {job_id: read_job(session, job_id)[1] for job_id in ids}
    assert plain[ids[0]]["cost"]["complete"] is False and plain[ids[1]]["cost"]["total"] == 1.5
    statements: list[str] = []
    engine = get_engine(pg_url)

    def executed(*args: object) -> None:
        statements.append(str(args[2]))

    event.listen(engine, "before_cursor_execute", executed)
    reads = JobReads(0.5, pg_sessions, prefetch=job_view.prefetch)

    async def everyone() -> list:
        return await asyncio.gather(
            *(reads.latest(("job", job_id), lambda s, j=job_id: read_job(s, j))
              for job_id in ids))

    try:
        found = asyncio.run(everyone())
    finally:
        event.remove(engine, "before_cursor_execute", executed)
    # The same objects as a read of each alone
    assert [seen.job for seen in found] == [plain[job_id] for job_id in ids]
    # The first read alone (three statements), then rounds of three whatever their size
    selects = [text for text in statements if text.lstrip().upper().startswith("SELECT")]
    assert len(selects) <= 3 * reads.sessions_used, (reads.sessions_used, selects)
    assert reads.sessions_used <= 3


@pytest.fixture
def keyed(pg_sessions, settings, monkeypatch) -> Iterator:
    settings.auth = True
    yield from app_client(settings, monkeypatch)


def _fast_path(client) -> StatusFastPath:
    layer = client.app.middleware_stack
    while not isinstance(layer, StatusFastPath):
        layer = layer.app
    return layer


def test_remembered_reads_skip_the_route_and_answer_as_it_does(keyed, pg_sessions, settings):
    mine = create_key(pg_sessions, "fast")
    other = create_key(pg_sessions, "other")
    job_id = make_job(pg_sessions, settings, "fast")
    fast = _fast_path(keyed)
    key = {"Authorization": f"Bearer {mine.secret}"}
    for path in (f"/jobs/{job_id}", f"/v1/batches/{job_id}"):
        routed = keyed.get(path, headers=key)  # the route reads the object and the key
        assert routed.status_code == 200
        before = fast.answered
        again = keyed.get(path, headers=key)
        assert fast.answered == before + 1  # from memory, before the routing
        assert again.content == routed.content
        assert again.headers["etag"] == routed.headers["etag"]
        assert again.headers["content-type"] == routed.headers["content-type"]
        assert again.headers["x-request-id"] != routed.headers["x-request-id"]
        etag = routed.headers["etag"]
        same = keyed.get(path, headers={"x-api-key": mine.secret, "If-None-Match": etag})
        assert same.status_code == 304 and same.headers["etag"] == etag
        assert fast.answered == before + 2
        # What the route must answer still goes to it: another tenant's job, no key, a
        # long-poll, a query string
        counted = fast.answered
        assert keyed.get(path, headers={"Authorization": f"Bearer {other.secret}"}
                         ).status_code == 404
        assert keyed.get(path).status_code == 401
        assert keyed.get(path, headers=key, params={"x": "1"}).status_code == 200
        assert fast.answered == counted

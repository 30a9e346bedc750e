"""Cheaper watching (issue #45, part 5): ETags and 304 on the status reads, the long-poll
`GET /jobs/{id}?wait=N` and the event stream `GET /jobs/{id}/events`, against a real
PostgreSQL and, for waits and disconnects, uvicorn on a real port (api_thread)."""

import asyncio
import io
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from api.console.session import COOKIE
from quotaflow.config import Settings
from quotaflow.ingest import pipeline
from quotaflow.jobs import service as jobs
from quotaflow.models import Job, JobStatus
from tests.harness.api_app import app_client
from tests.harness.api_thread import api_in_thread
from tests.harness.factories import chat_line, jsonl
from tests.harness.procs import quotaflow


class Collect:
    def dispatch(self, queue: str, batches: list) -> None:
        """Nothing runs: the jobs stay as made, and the tests change them."""


def make_job(sessions: sessionmaker[Session], settings: Settings, lines: int = 5,
             output_format: str | None = None) -> str:
    return pipeline.create_job_in_process(
        sessions, io.BytesIO(jsonl([chat_line(f"r{i}") for i in range(lines)])),
        settings=settings, deployments=settings.load_deployments(), dispatcher=Collect(),
        queue="bulk", filename="in.jsonl", output_format=output_format).id


def touch(sessions: sessionmaker[Session], job_id: str, step: str) -> None:
    """A change to the job's object made by another transaction (not the API's)."""
    with sessions.begin() as session:
        session.execute(update(Job).where(Job.id == job_id).values(metadata_={"step": step}))


def finish(sessions: sessionmaker[Session], job_id: str) -> None:
    jobs.cancel_job(sessions, job_id)


@pytest.fixture
def client(pg_sessions, settings, monkeypatch) -> Iterator:
    settings.auth = False
    yield from app_client(settings, monkeypatch)


@pytest.fixture
def served(pg_sessions, settings, monkeypatch) -> Iterator[tuple]:
    settings.auth = False
    settings.watch_interval_s = 0.3
    settings.events_keepalive_s = 1.0
    with api_in_thread(settings, monkeypatch) as (app, url):
        yield app, url


def test_status_reads_answer_304_until_the_object_changes(client, pg_sessions, settings):
    job_id = make_job(pg_sessions, settings, output_format="anthropic")
    message_batch = "msgbatch_" + job_id.removeprefix("batch_")
    for path in (f"/jobs/{job_id}", f"/v1/batches/{job_id}",
                 f"/v1/messages/batches/{message_batch}"):
        first = client.get(path)
        assert first.status_code == 200, (path, first.text)
        etag = first.headers["etag"]
        assert etag.startswith('"') and etag.endswith('"'), etag
        # The tag is the body's: the same object read again has the same tag
        assert client.get(path).headers["etag"] == etag
        for sent in (etag, f"W/{etag}", f'"other", {etag}', "*"):
            same = client.get(path, headers={"If-None-Match": sent})
            assert same.status_code == 304, (path, sent)
            assert same.headers["etag"] == etag and same.content == b""
        stale = client.get(path, headers={"If-None-Match": '"0000000000000000"'})
        assert stale.status_code == 200 and stale.json() == first.json()
    etags = {path: client.get(path).headers["etag"] for path in (
        f"/jobs/{job_id}", f"/v1/batches/{job_id}", f"/v1/messages/batches/{message_batch}")}
    touch(pg_sessions, job_id, "2")
    finish(pg_sessions, job_id)
    # A change made elsewhere (here: in the database) shows within api_status_cache_s.
    deadline = time.monotonic() + settings.api_status_cache_s + 1
    for path, etag in etags.items():
        changed = client.get(path, headers={"If-None-Match": etag})
        while changed.status_code == 304 and time.monotonic() < deadline:
            time.sleep(0.05)
            changed = client.get(path, headers={"If-None-Match": etag})
        assert changed.status_code == 200, path
        assert changed.headers["etag"] != etag and changed.json()["id"]


def test_wait_is_validated(client, pg_sessions, settings):
    job_id = make_job(pg_sessions, settings)
    for bad in ("0", "-1", "31", "abc", "nan"):
        answer = client.get(f"/jobs/{job_id}", params={"wait": bad})
        assert answer.status_code == 422, (bad, answer.text)
        assert answer.json()["detail"][0]["loc"] == ["query", "wait"]
    assert client.get("/jobs/batch_nope", params={"wait": "1"}).status_code == 404


def test_long_poll_answers_soon_after_a_change_and_at_the_timeout(served, pg_sessions,
                                                                  settings):
    app, url = served
    job_id = make_job(pg_sessions, settings)
    with httpx.Client(base_url=url, timeout=40) as http:
        etag = http.get(f"/jobs/{job_id}").headers["etag"]
        # Unchanged: the wait runs out, then 304 (with the tag) or, without one, the object
        started = time.monotonic()
        same = http.get(f"/jobs/{job_id}", params={"wait": 1.5},
                        headers={"If-None-Match": etag})
        assert same.status_code == 304 and same.headers["etag"] == etag
        assert 1.4 <= time.monotonic() - started < 3
        plain = http.get(f"/jobs/{job_id}", params={"wait": 1})
        assert plain.status_code == 200 and plain.headers["etag"] == etag
        # Changed by another transaction: answered within about a second of the change
        changed_at: list[float] = []
        changer = threading.Timer(1.0, lambda: (touch(pg_sessions, job_id, "2"),
                                                changed_at.append(time.monotonic())))
        changer.start()
        started = time.monotonic()
        moved = http.get(f"/jobs/{job_id}", params={"wait": 20},
                         headers={"If-None-Match": etag})
        answered = time.monotonic()
        changer.join()
        assert moved.status_code == 200 and moved.json()["metadata"] == {"step": "2"}
        assert moved.headers["etag"] != etag
        assert answered - changed_at[0] < 1.2, answered - changed_at[0]
        assert answered - started < 5
        # A stale tag is answered at once; so is a final job
        started = time.monotonic()
        assert http.get(f"/jobs/{job_id}", params={"wait": 20},
                        headers={"If-None-Match": etag}).status_code == 200
        finish(pg_sessions, job_id)
        final = http.get(f"/jobs/{job_id}", params={"wait": 20})
        assert final.json()["status"] in JobStatus.FINAL
        assert time.monotonic() - started < 3
    assert app.state.job_watchers.watched == {}


def test_a_status_change_wakes_a_long_poll_before_its_interval(pg_sessions, settings,
                                                               monkeypatch):
    # Given an API that reads a watched job only every 10 s
    settings.auth = False
    settings.watch_interval_s = 10.0
    job_id = make_job(pg_sessions, settings)
    with api_in_thread(settings, monkeypatch) as (app, url), \
            httpx.Client(base_url=url, timeout=40) as http:
        etag = http.get(f"/jobs/{job_id}").headers["etag"]
        # When another transaction (a worker's, say) changes the job's status
        changed_at: list[float] = []
        changer = threading.Timer(1.5, lambda: (finish(pg_sessions, job_id),
                                                changed_at.append(time.monotonic())))
        changer.start()
        ended = http.get(f"/jobs/{job_id}", params={"wait": 20},
                         headers={"If-None-Match": etag})
        answered = time.monotonic()
        changer.join()
        # Then the long-poll answers as it commits, told by PostgreSQL, not 10 s later
        # (a cancel may first commit `cancelling`: the first change is what it answers)
        assert ended.status_code == 200
        assert ended.json()["status"] in (JobStatus.CANCELLING, *JobStatus.FINAL)
        assert answered - changed_at[0] < 1.0, answered - changed_at[0]
        # And a plain read after it is fresh too (the process's recent read was dropped)
        assert http.get(f"/jobs/{job_id}").json()["status"] != "in_progress"
        assert app.state.job_watchers.watched == {}


def events(lines: Iterator[str]) -> Iterator[dict]:
    """The stream's events as dicts of their fields ("" for comment lines)."""
    event: dict = {}
    for line in lines:
        if line == "":
            if event:
                yield event
            event = {}
        elif line.startswith(":"):
            yield {"comment": line}
        else:
            name, _, value = line.partition(":")
            event[name] = value.removeprefix(" ")


def test_events_send_the_job_its_changes_and_end_when_final(served, pg_sessions, settings):
    app, url = served
    job_id = make_job(pg_sessions, settings)
    got: list[dict] = []
    with httpx.Client(base_url=url, timeout=30) as http, \
            http.stream("GET", f"/jobs/{job_id}/events") as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        threading.Timer(1.5, touch, (pg_sessions, job_id, "2")).start()
        threading.Timer(3.0, finish, (pg_sessions, job_id)).start()
        started = time.monotonic()
        got = list(events(stream.iter_lines()))
        assert time.monotonic() - started < 10
    comments = [e for e in got if "comment" in e]
    objects = [e for e in got if "comment" not in e]
    assert comments, "no keep-alive comment in 3 s at QUOTAFLOW_EVENTS_KEEPALIVE_S=1"
    assert all(e["event"] == "job" for e in objects)
    jobs_seen = [json.loads(e["data"]) for e in objects]
    assert jobs_seen[0]["metadata"] is None and jobs_seen[0]["status"] not in JobStatus.FINAL
    assert any(j["metadata"] == {"step": "2"} for j in jobs_seen)
    assert jobs_seen[-1]["status"] in JobStatus.FINAL
    ids = [e["id"] for e in objects]
    assert len(set(ids)) == len(ids), "an unchanged object was sent twice"
    with httpx.Client(base_url=url, timeout=30) as http:
        etag = http.get(f"/jobs/{job_id}").headers["etag"]
        assert ids[-1] == etag
        # A reconnect after the last state: 204, which tells an EventSource to stop
        again = http.get(f"/jobs/{job_id}/events", headers={"Last-Event-ID": ids[-1]})
        assert again.status_code == 204
        # A reconnect from an earlier state gets the final one only
        resumed = http.get(f"/jobs/{job_id}/events", headers={"Last-Event-ID": ids[0]})
        sent = [e for e in events(resumed.text.splitlines()) if "id" in e]
        assert [e["id"] for e in sent] == [etag]
        assert http.get("/jobs/batch_nope/events").status_code == 404
    assert app.state.job_watchers.watched == {}


async def _crowd(url: str, job_id: str, count: int, wait: float) -> list[int]:
    limits = httpx.Limits(max_connections=count + 10)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
        answers = await asyncio.gather(*(http.get(f"/jobs/{job_id}", params={"wait": wait})
                                         for _ in range(count)))
    return [a.status_code for a in answers]


def test_a_crowd_of_long_polls_costs_one_read_per_interval(served, pg_sessions, settings):
    app, url = served
    job_id = make_job(pg_sessions, settings)
    httpx.get(f"{url}/healthz", timeout=10)
    result: list[list[int]] = []
    crowd = threading.Thread(target=lambda: result.append(
        asyncio.run(_crowd(url, job_id, 200, 6.0))))
    started = time.monotonic()
    crowd.start()
    deadline = time.monotonic() + 20
    while getattr(app.state, "job_watchers", None) is None or \
            app.state.job_watchers.watched.get(job_id, 0) < 200:
        assert time.monotonic() < deadline, "the 200 long-polls never all waited"
        time.sleep(0.05)
    watchers = app.state.job_watchers
    reads_before, waited_at = watchers.reads, time.monotonic()
    # While they wait, the database pool is free: plain reads answer at once (not after
    # a pool's 30 s wait; the bound leaves room for this process's own 200 clients on a
    # machine busy with other tests)
    for _ in range(5):
        began = time.monotonic()
        assert httpx.get(f"{url}/jobs/{job_id}", timeout=10).status_code == 200
        assert time.monotonic() - began < 3.0
    time.sleep(2.0)
    reads = watchers.reads - reads_before
    intervals = (time.monotonic() - waited_at) / settings.watch_interval_s
    assert reads <= intervals + 2, (reads, intervals)  # one per interval, not per client
    crowd.join(30)
    assert result and result[0] == [200] * 200
    assert time.monotonic() - started < 20
    assert watchers.watched == {}
    # All 200 cost no more reads than one waiter would
    assert watchers.reads < 200


def test_a_client_that_leaves_leaves_no_waiter(served, pg_sessions, settings):
    app, url = served
    job_id = make_job(pg_sessions, settings)

    async def leave() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            polls = [asyncio.create_task(http.get(f"/jobs/{job_id}", params={"wait": 25}))
                     for _ in range(5)]
            async with http.stream("GET", f"/jobs/{job_id}/events") as stream:
                async for line in stream.aiter_lines():
                    if line.startswith("data:"):
                        break
                deadline = time.monotonic() + 10
                while app.state.job_watchers.watched.get(job_id) != 6:
                    assert time.monotonic() < deadline, app.state.job_watchers.watched
                    await asyncio.sleep(0.05)
            for poll in polls:
                poll.cancel()
            await asyncio.gather(*polls, return_exceptions=True)

    asyncio.run(leave())
    deadline = time.monotonic() + 10
    while app.state.job_watchers.watched:
        assert time.monotonic() < deadline, app.state.job_watchers.watched
        time.sleep(0.05)
    reads = app.state.job_watchers.reads
    time.sleep(1.0)
    assert app.state.job_watchers.reads == reads, "the job is still read with no waiter"


def _watch_with_cli(app, url: str, pg_sessions, job_id: str) -> tuple[str, int]:
    """`quotaflow status --watch` on a job that changes, then is cancelled: its stdout,
    and the most waiters the API held for the job meanwhile."""
    env = {**os.environ, "QUOTAFLOW_API_URL": url, "QUOTAFLOW_AUTH": "off"}
    env.pop("QUOTAFLOW_API_KEY", None)
    watcher = subprocess.Popen(quotaflow("status", job_id, "--watch"), env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    most = 0
    try:
        deadline = time.monotonic() + 8  # the CLI's start, then its first waiter
        while not most and time.monotonic() < deadline and watcher.poll() is None:
            found = getattr(app.state, "job_watchers", None)
            most = found.watched.get(job_id, 0) if found else 0
            time.sleep(0.05)
        touch(pg_sessions, job_id, "2")
        time.sleep(1.0)
        finish(pg_sessions, job_id)
        out, err = watcher.communicate(timeout=30)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    assert "cancel" in out, (out, err)
    return out, most


def test_status_watch_follows_the_event_stream(served, pg_sessions, settings):
    app, url = served
    job_id = make_job(pg_sessions, settings)
    started = time.monotonic()
    _, most = _watch_with_cli(app, url, pg_sessions, job_id)
    assert most == 1, "the CLI did not wait on the job's event stream"
    assert time.monotonic() - started < 20


def without_events(app: ASGIApp) -> ASGIApp:
    """The API as one older than the event stream answers it: 404."""
    async def older(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].endswith("/events"):
            await Response(status_code=404)(scope, receive, send)
        else:
            await app(scope, receive, send)
    return older


def test_status_watch_polls_an_api_without_the_stream(pg_sessions, settings, monkeypatch):
    settings.auth = False
    with api_in_thread(settings, monkeypatch, wrap=without_events) as (app, url):
        job_id = make_job(pg_sessions, settings)
        _, most = _watch_with_cli(app, url, pg_sessions, job_id)
    assert most == 0


def test_the_console_follows_the_job_stream(served, pg_sessions, settings):
    app, url = served
    job_id = make_job(pg_sessions, settings)
    with httpx.Client(base_url=url, timeout=30, cookies={COOKIE: "qf-dev-anyone"}) as http:
        page = http.get(f"/console/jobs/{job_id}")
        assert f'data-events="/console/jobs/{job_id}/events"' in page.text
        assert 'data-every="1000"' in page.text  # the timer, without the stream or script
        threading.Timer(1.0, finish, (pg_sessions, job_id)).start()
        with http.stream("GET", f"/console/jobs/{job_id}/events") as stream:
            assert stream.status_code == 200
            got = [e for e in events(stream.iter_lines()) if "data" in e]
        assert json.loads(got[-1]["data"])["status"] in JobStatus.FINAL
        assert http.get("/console/jobs/batch_nope/events").status_code == 404
    signed_out = httpx.get(f"{url}/console/jobs/{job_id}/events", timeout=10)
    assert signed_out.status_code == 303
    assert app.state.job_watchers.watched == {}

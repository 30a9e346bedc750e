"""`quotaflow api --workers 2`: two processes behind one port, and everything a client
does works whichever of them answers (#45: idempotency keys, streamed uploads, console
sessions and CSRF tokens, long-polls, the per-key request limit counted in Redis), and the whole
group ends within seconds of a signal, leaving no process.

Each request goes on a connection of its own, and the process that answered it is read
from /proc (tests/harness/served_by.py): a test asserts that both processes served.
"""

import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from quotaflow.tenants import keys as auth
from tests.harness import served_by
from tests.harness.factories import chat_line, jsonl
from tests.harness.procs import Proc, free_port, quotaflow
from tests.harness.servers import REDIS_URL, flush_redis, service_env

LIMIT, WINDOW_S = 30, 6  # the API's per-key limit here: `30/6 seconds`
STOP_WITHIN_S = 10.0


@dataclass
class Api:
    proc: Proc
    port: int
    workers: list[int]

    def send(self, method: str, path: str, key: str | None = None,
             body: bytes | Iterable[bytes] | None = None,
             headers: dict[str, str] | None = None) -> served_by.Answer:
        sent = {**({"Authorization": f"Bearer {key}"} if key else {}), **(headers or {})}
        return served_by.send(self.port, self.workers, method, path, body, sent)

    def until_both(self, request, tries: int = 24) -> list[served_by.Answer]:
        """`request()` again until each process answered one (each a new connection)."""
        answers: list[served_by.Answer] = []
        while len(answers) < tries:
            answers.append(request())
            if {a.pid for a in answers} == set(self.workers):
                return answers
        pytest.fail(f"{tries} requests all answered by {[a.pid for a in answers]}")


def start_api(pg_url: str, workdir: Path, name: str, **env: str) -> tuple[Proc, int]:
    port = free_port()
    proc = Proc(name, quotaflow("api", "--port", str(port), "--workers", "2"),
                service_env(QUOTAFLOW_DATABASE_URL=pg_url, QUOTAFLOW_BROKER_URL=REDIS_URL,
                            **env), workdir)
    proc.wait_http(f"http://127.0.0.1:{port}/healthz", timeout=90)
    return proc, port


def worker_pids(proc: Proc, port: int, count: int = 2, timeout: float = 60.0) -> list[int]:
    """The supervisor's worker processes, once `count` of them listen on `port` (the
    first answers /healthz while the other may still be importing the app)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = [p for p in served_by.children(proc.pid)
                   if "resource_tracker" not in Path(f"/proc/{p}/cmdline").read_text()]
        if len(workers) == count and all(served_by.listens(p, port) for p in workers):
            return workers
        time.sleep(0.2)
    raise AssertionError(f"no {count} worker processes under {proc.pid}:\n{proc.log()}")


@pytest.fixture(scope="module")
def api(pg_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    flush_redis(REDIS_URL)
    proc, port = start_api(pg_url, tmp_path_factory.mktemp("api-processes"), "api",
                           QUOTAFLOW_API_RATE_LIMIT=f"{LIMIT}/{WINDOW_S} seconds")
    try:
        yield Api(proc, port, worker_pids(proc, port))
    finally:
        proc.stop()


@pytest.fixture
def key(pg_sessions) -> str:
    """A key of a tenant of its own: each test has the limit's whole window to itself."""
    return auth.create_key(pg_sessions, f"t{time.monotonic_ns()}").secret


def lines(count: int) -> bytes:
    return jsonl([chat_line(f"req-{i}") for i in range(count)])


def test_one_idempotency_key_makes_one_job_whichever_process_answers(api: Api, key) -> None:
    body, answers, errors = lines(5), [], []

    def post() -> None:
        try:
            answers.append(api.send("POST", "/jobs/jsonl?queue=realtime", key, body,
                                    {"Idempotency-Key": "once-only",
                                     "Content-Type": "application/jsonl"}))
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=post) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    answers += api.until_both(lambda: api.send(
        "POST", "/jobs/jsonl?queue=realtime", key, body,
        {"Idempotency-Key": "once-only", "Content-Type": "application/jsonl"}))
    assert not errors, errors
    assert all(a.status in (200, 201) for a in answers), [(a.status, a.body) for a in answers]
    assert len({json.loads(a.body)["id"] for a in answers}) == 1
    assert {a.pid for a in answers} == set(api.workers)


def test_a_streamed_upload_is_read_by_either_process(api: Api, key) -> None:
    def upload() -> served_by.Answer:  # sent as it is made: chunked, no Content-Length
        body = lines(300)
        pieces = (body[i:i + 4096] for i in range(0, len(body), 4096))
        return api.send("POST", "/jobs/jsonl", key, pieces, {"Content-Type": "application/jsonl"})

    for answer in api.until_both(upload, tries=12):
        assert answer.status == 201, answer.body
        job = json.loads(answer.body)
        read = api.send("GET", f"/jobs/{job['id']}", key)  # either process reads it
        assert read.status == 200 and json.loads(read.body)["request_counts"]["total"] == 300


def test_a_console_session_and_its_csrf_token_hold_across_processes(api: Api, key) -> None:
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    signed_in = api.send("POST", "/console/login", None, f"api_key={key}".encode(), form)
    assert signed_in.status == 303, signed_in.body
    cookie = {"Cookie": f"quotaflow_console={signed_in.cookies['quotaflow_console']}"}
    pages = api.until_both(lambda: api.send("GET", "/console/jobs", None, None, cookie))
    assert all(p.status == 200 for p in pages), [p.status for p in pages]
    token = {re.search(rb'name="csrf_token" value="([^"]+)"', p.body).group(1) for p in pages}
    assert len(token) == 1  # every process writes the same token into its forms
    # A form posted to any process is accepted with the token another process wrote...
    out = api.until_both(lambda: api.send(
        "POST", "/console/logout", None, b"csrf_token=" + next(iter(token)),
        {**form, **cookie}))
    assert all(o.status == 303 for o in out), [(o.status, o.body) for o in out]
    # ...and refused without it, by any process.
    refused = api.until_both(lambda: api.send("POST", "/console/logout", None, b"",
                                              {**form, **cookie}))
    assert all(r.status == 403 for r in refused), [(r.status, r.body) for r in refused]


def test_a_long_poll_held_by_one_process_answers_a_change_made_through_the_other(
        api: Api, key) -> None:
    made = api.send("POST", "/jobs/jsonl", key, lines(3), {"Content-Type": "application/jsonl"})
    assert made.status == 201, made.body
    job = json.loads(made.body)
    auth_header = {"Authorization": f"Bearer {key}"}
    waiting, waiter = served_by.connect(api.port, api.workers)
    waiting.request("GET", f"/jobs/{job['id']}?wait=20", headers=auth_header)
    time.sleep(1.0)  # the long-poll has read the job as it was, and waits
    other, changer = served_by.connect(api.port, api.workers, avoid=waiter)
    began = time.monotonic()
    other.request("POST", f"/jobs/{job['id']}/cancel", headers=auth_header)
    cancelled = other.getresponse()
    assert cancelled.status == 200, cancelled.read()
    other.close()
    answer = waiting.getresponse()
    took = time.monotonic() - began
    seen = json.loads(answer.read())
    waiting.close()
    assert answer.status == 200 and waiter != changer
    assert seen["status"] in ("cancelling", "cancelled"), seen
    assert took < 5.0, took  # woken by the change, not by the end of its 20 s wait


def _next_window() -> None:
    """Sleep to the start of a fresh window of the limit (the windows follow the clock)."""
    time.sleep(WINDOW_S - time.time() % WINDOW_S + 0.05)


def test_the_request_limit_is_one_count_across_processes(api: Api, pg_sessions) -> None:
    noisy = auth.create_key(pg_sessions, "noisy").secret
    quiet = auth.create_key(pg_sessions, "quiet").secret
    _next_window()
    answers = [api.send("GET", "/jobs", noisy) for _ in range(LIMIT + 5)]
    statuses = [a.status for a in answers]
    assert statuses == [200] * LIMIT + [429] * 5, statuses  # both processes, one count
    assert {a.pid for a in answers[:LIMIT]} == set(api.workers)
    refused = answers[-1]
    assert 1 <= int(refused.headers["retry-after"]) <= WINDOW_S
    assert refused.headers["ratelimit-limit"] == str(LIMIT)
    assert refused.headers["ratelimit-remaining"] == "0"
    assert json.loads(refused.body)["error"]["code"] == "rate_limit_exceeded"
    assert [a.headers["ratelimit-remaining"] for a in answers[:3]] == [
        str(LIMIT - 1), str(LIMIT - 2), str(LIMIT - 3)]
    # Another tenant's reads go on meanwhile, on both processes.
    others = api.until_both(lambda: api.send("GET", "/jobs", quiet))
    assert all(o.status == 200 for o in others)
    # The window ends: the noisy key is served again.
    time.sleep(int(refused.headers["retry-after"]) + 0.1)
    again = api.send("GET", "/jobs", noisy)
    assert again.status == 200 and again.headers["ratelimit-remaining"] == str(LIMIT - 1)


def _ends_within(proc: Proc, how) -> float:
    members = served_by.group(proc.pid)
    assert len(members) >= 3, members  # the supervisor and its two workers
    began = time.monotonic()
    how()
    while served_by.group(proc.pid) and time.monotonic() - began < STOP_WITHIN_S + 5:
        proc.popen.poll()
        time.sleep(0.05)
    took = time.monotonic() - began
    left = served_by.group(proc.pid)
    assert not left and took < STOP_WITHIN_S, (left, took, proc.log())
    return took


def test_sigterm_to_the_supervisor_ends_every_process(api: Api) -> None:
    _ends_within(api.proc, lambda: os.kill(api.proc.pid, signal.SIGTERM))


def test_sigint_to_the_group_ends_every_process(pg_url: str, tmp_path: Path) -> None:
    proc, port = start_api(pg_url, tmp_path, "api-sigint")
    try:
        worker_pids(proc, port)
        _ends_within(proc, lambda: os.killpg(proc.pid, signal.SIGINT))
    finally:
        proc.stop()
